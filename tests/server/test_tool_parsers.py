"""Tool-call parsers (vLLM's hermes, llama3_json, pythonic) on model outputs of each format:
calls come out as OpenAI function calls; prose and malformed calls stay text."""

from __future__ import annotations

import json

import pytest

from cadence.server.tool_parsers import TOOL_PARSERS


def test_hermes():
    parse = TOOL_PARSERS["hermes"]
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, calls = parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parse("Just text.") == ("Just text.", [])
    broken = '<tool_call>{"name": "f", "arguments": {</tool_call>'
    assert parse(broken) == (broken, [])


def test_llama3_json():
    parse = TOOL_PARSERS["llama3_json"]
    content, calls = parse('<|python_tag|>{"name": "search", "parameters": {"q": "cpu"}}; '
                           '{"name": "noop", "parameters": {}}')
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"q": "cpu"}),
                                                                  ("noop", {})]
    assert parse("The answer is 4.") == ("The answer is 4.", [])
    assert parse('{"not": "a call"}') == ('{"not": "a call"}', [])


def test_pythonic():
    parse = TOOL_PARSERS["pythonic"]
    content, calls = parse('[get_weather(city="Paris", days=2), get_time()]')
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
    for text in ("[1, 2]", "[f(x)]", "[__import__('os').system('x')]", "hello"):
        assert parse(text) == (text, [])


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_openai_shape(name):
    sample = {"hermes": '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
              "llama3_json": '{"name": "f", "parameters": {"a": 1}}',
              "pythonic": "[f(a=1)]"}[name]
    _, calls = TOOL_PARSERS[name](sample)
    entry = calls[0].to_openai(0)
    assert entry["type"] == "function" and entry["id"].startswith("call_")
    assert entry["function"] == {"name": "f", "arguments": '{"a": 1}'}


# ---- through the server: the tiny model is forced (guided_choice) to write a call ----------

HERMES_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tool_server(tiny_llama_dir, tmp_path_factory):
    from server_harness import start_server, tiny_model_args

    server = start_server(str(tmp_path_factory.mktemp("server")),
                          *tiny_model_args(tiny_llama_dir), "--enable-auto-tool-choice",
                          "--tool-call-parser", "hermes")
    yield server
    server.stop()


def _chat(server, messages, **extra):
    import httpx

    return httpx.post(server.base_url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "tools": TOOLS, "max_tokens": 200, "temperature": 0,
        "guided_choice": [HERMES_CALL], **extra})


def test_tool_call_reply_whole_and_streamed(tool_server):
    import httpx

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = _chat(tool_server, messages)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    with httpx.stream("POST", tool_server.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": messages, "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "guided_choice": [HERMES_CALL], "stream": True}) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines()
                  if line.startswith("data: {")]
    deltas = [e["choices"][0] for e in events if e["choices"]]
    calls = [d["delta"]["tool_calls"] for d in deltas if "tool_calls" in d["delta"]]
    assert calls and calls[0][0]["function"]["name"] == "get_weather"
    assert deltas[-1]["finish_reason"] == "tool_calls"
    # The conversation goes on with the call and the tool's answer in it.
    history = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    r = _chat(tool_server, history, guided_choice=["It is sunny."])
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "It is sunny." and "tool_calls" not in message


def test_tool_choice_required_is_refused_and_none_is_plain_text(tool_server):
    r = _chat(tool_server, [{"role": "user", "content": "x"}], tool_choice="required")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = _chat(tool_server, [{"role": "user", "content": "x"}], tool_choice="none")
    message = r.json()["choices"][0]["message"]
    assert message["content"] == HERMES_CALL and "tool_calls" not in message


def test_malformed_tool_calls_in_the_history_are_a_400(tool_server):
    for bad in ({"function": "get_weather"}, {"id": "c1", "type": "function"}):
        r = _chat(tool_server, [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": None, "tool_calls": [bad]}])
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
