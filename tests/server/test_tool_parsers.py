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


def _stream(server, messages, **extra) -> list[dict]:
    """The choice entries of a streamed chat reply."""
    import httpx

    body = {"messages": messages, "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "stream": True, **extra}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=120,
                      json=body) as stream:
        assert stream.status_code == 200, stream.read()
        events = [json.loads(line[6:]) for line in stream.iter_lines()
                  if line.startswith("data: {")]
    return [e["choices"][0] for e in events if e["choices"]]


def _streamed_calls(deltas: list[dict]) -> list[dict]:
    """The calls as a client assembles them from tool_calls deltas (OpenAI's rules)."""
    calls: dict[int, dict] = {}
    for d in deltas:
        for piece in d["delta"].get("tool_calls") or ():
            call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
            if "id" in piece:
                assert piece["type"] == "function" and "id" not in call
                call["id"] = piece["id"]
            call["name"] += piece["function"].get("name", "")
            call["arguments"] += piece["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def test_tool_call_reply_whole_and_streamed(tool_server):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = _chat(tool_server, messages, return_token_ids=True)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert len(choice["token_ids"]) == r.json()["usage"]["completion_tokens"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    # Streamed as vLLM does: the name in the call's first delta, then argument pieces.
    deltas = _stream(tool_server, messages, guided_choice=[HERMES_CALL], return_token_ids=True)
    # Ids the call reader holds back with their text ride on later chunks: each once, in order.
    assert [t for d in deltas for t in d["token_ids"]] == choice["token_ids"]
    pieces = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert pieces[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert pieces[0]["id"].startswith("call_") and len(pieces) > 2
    assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])
    (streamed,) = _streamed_calls(deltas)
    assert json.loads(streamed["arguments"]) == {"city": "Paris"}
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert not any(d["delta"].get("content") for d in deltas)
    # The conversation goes on with the call and the tool's answer in it.
    history = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    r = _chat(tool_server, history, guided_choice=["It is sunny."])
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "It is sunny." and "tool_calls" not in message


# Bounded arguments (an enum, no other keys), so the random tiny model cannot ramble.
CITY_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]


def test_tool_choice_named_and_required_are_held_to_the_tools(tool_server):
    """vLLM's: a named function holds the output to its parameters' JSON schema (finish
    "stop"); "required" to a list of calls of the given tools (finish "tool_calls")."""
    messages = [{"role": "user", "content": "Weather?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _chat(tool_server, messages, tools=CITY_TOOLS, tool_choice=named, guided_choice=None)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and choice["finish_reason"] == "stop"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    deltas = _stream(tool_server, messages, tools=CITY_TOOLS, tool_choice=named)
    (streamed,) = _streamed_calls(deltas)
    assert streamed["name"] == "get_weather"
    assert json.loads(streamed["arguments"]) == json.loads(call["function"]["arguments"])
    r = _chat(tool_server, messages, tools=CITY_TOOLS, tool_choice="required",
              guided_choice=None, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] in ("get_weather", "get_time")
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    deltas = _stream(tool_server, messages, tools=CITY_TOOLS, tool_choice="required",
                     parallel_tool_calls=False)
    (streamed,) = _streamed_calls(deltas)
    assert streamed["name"] == call["function"]["name"]
    assert json.loads(streamed["arguments"]) == json.loads(call["function"]["arguments"])
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_tool_choice_errors_and_none_is_plain_text(tool_server):
    x = [{"role": "user", "content": "x"}]
    for choice in ({"type": "function", "function": {"name": "nope"}}, {"type": "function"},
                   "sometimes"):
        r = _chat(tool_server, x, tool_choice=choice, guided_choice=None)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    for tools in ([1], [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
                  [{"type": "function"}]):
        r = _chat(tool_server, x, tools=tools, tool_choice="required", guided_choice=None)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("tools"), r.text
    r = _chat(tool_server, x, tool_choice={"type": "function", "function": {"name": 5}},
              guided_choice=None)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    # The grammar of "required" is the request's structured output: not both.
    r = _chat(tool_server, x, tool_choice="required")
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_choice", r.text
    r = _chat(tool_server, x, tools=None, tool_choice="required", guided_choice=None)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = _chat(tool_server, x, tool_choice="none")
    message = r.json()["choices"][0]["message"]
    assert message["content"] == HERMES_CALL and "tool_calls" not in message


def test_malformed_tool_calls_in_the_history_are_a_400(tool_server):
    for bad in ({"function": "get_weather"}, {"id": "c1", "type": "function"}):
        r = _chat(tool_server, [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": None, "tool_calls": [bad]}])
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
