"""Streamed tool calls (vLLM's shape): a call's first delta has its id, type and name, later
deltas pieces of its arguments; fed in any split, each parser's stream agrees with its
whole-reply reader (the same calls, the same content), and it sends calls before the reply
ends."""

from __future__ import annotations

import json

import pytest

from cadence.server.tool_parsers import TOOL_PARSERS
from cadence.server.tool_streaming import (ARGS, CONTENT, START, named_call_stream,
                                           required_calls_stream, tool_stream)

SAMPLES = {
    "hermes": [
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"q": "a } \\" ] {", "n": [1, {"x": 2}]}}'
        '</tool_call>',
        '<tool_call>{"arguments": {"a": 1}, "name": "swapped"}</tool_call>',
        '<tool_call>{"name": "s", "arguments": "{\\"a\\": 1}"}</tool_call>',
        "Just text < with a bracket and <tool_ half a tag.",
        "Just text.",
    ],
    "llama3_json": [
        '<|python_tag|>{"name": "search", "parameters": {"q": "cpu"}}; '
        '{"name": "noop", "parameters": {}}',
        '{"name": "f", "parameters": {"deep": {"a": [1, 2, "]"]}}}',
        "The answer is 4.",
        '{"not": "a call"}',
        "  {\"name\": \"g\", \"arguments\": {\"x\": null}}",
    ],
    "pythonic": [
        '[get_weather(city="Paris", days=2), get_time()]',
        "[f(s='a, b) ]', n=[1, (2, 3)])]",
        "[1, 2]",
        "[f(x)]",
        "[__import__('os').system('x')]",
        "hello [f()]",
        "<|python_start|>[f(a=1)]<|python_end|>",
    ],
}


def _run(stream, text: str, step: int) -> list:
    events = []
    for i in range(0, len(text), step):
        events += stream.feed(text[i:i + step])
    return events + stream.finish()


def _collect(events) -> tuple[str, list[tuple[str, dict]]]:
    content = "".join(e.text for e in events if e.kind == CONTENT)
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for e in events:
        if e.kind == START:
            assert e.index not in names and e.call_id.startswith("call_")
            names[e.index], args[e.index] = e.name, ""
        elif e.kind == ARGS:
            assert e.index in names  # the name goes out first
            args[e.index] += e.text
    assert sorted(names) == list(range(len(names)))
    return content, [(names[i], json.loads(args[i])) for i in sorted(names)]


@pytest.mark.parametrize("parser", sorted(SAMPLES))
def test_streams_agree_with_the_whole_reply_reader(parser):
    for text in SAMPLES[parser]:
        whole_content, whole_calls = TOOL_PARSERS[parser](text)
        want = [(c.name, json.loads(c.arguments)) for c in whole_calls]
        for step in (1, 2, 3, 7, len(text)):
            content, calls = _collect(_run(tool_stream(parser), text, step))
            assert calls == want, (text, step)
            assert (content.strip() or None) == (whole_content.strip() or None
                                                 if whole_content else None), (text, step)


def test_hermes_sends_the_name_then_argument_pieces_before_the_end():
    stream = tool_stream("hermes")
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    events = []
    for ch in text:
        events += stream.feed(ch)
    # No closing tag yet: the call's name went out, then its arguments piece by piece.
    assert events[0].kind == START and events[0].name == "get_weather"
    pieces = [e.text for e in events[1:]]
    assert len(pieces) > 5 and all(e.kind == ARGS for e in events[1:])
    assert json.loads("".join(pieces)) == {"city": "Paris", "days": 2}
    assert events[0].delta()["tool_calls"][0]["function"] == {"name": "get_weather",
                                                              "arguments": ""}
    assert events[1].delta() == {"tool_calls": [{"index": 0,
                                                 "function": {"arguments": pieces[0]}}]}


def test_named_and_required_streams():
    events = _run(named_call_stream("get_weather"), '{"city": "Paris"}', 4)
    assert _collect(events) == ("", [("get_weather", {"city": "Paris"})])
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    assert _collect(_run(required_calls_stream(), text, 5)) == ("", [("a", {"x": 1}),
                                                                      ("b", {})])


@pytest.mark.parametrize("parser, text", [
    ("hermes", 'Sure.<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'),
    ("llama3_json", '{"name": "get_time", "parameters": {"tz": "UTC"}}'),
    ("pythonic", '[get_time(tz="UTC")]'),
])
def test_chat_chunks_per_parser(parser, text):
    """The chat renderer's SSE chunks for a reply arriving a few characters per output:
    tool_calls deltas before the end, finish_reason "tool_calls"."""
    from cadence.engine.outputs import RequestOutput
    from cadence.server.serving import ResponseContext
    from cadence.server.serving_chat import ChatRenderer
    from cadence.server.tool_choice import tool_mode

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    render = ChatRenderer(ResponseContext("chatcmpl-1", 0, "m", False, False),
                          tools=tool_mode(tools, "auto", parser))
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    chunks = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        chunks += render.output_chunks(RequestOutput(
            "r", (k,), piece, last, "stop" if last else None, 5, k + 1, 0), 0)
    deltas = [c["choices"][0] for c in chunks]
    calls = [d for d in deltas if d["delta"].get("tool_calls")]
    assert calls[0]["delta"]["tool_calls"][0]["function"] == {"name": "get_time",
                                                              "arguments": ""}
    args = "".join(d["delta"]["tool_calls"][0]["function"]["arguments"] for d in calls)
    assert json.loads(args) == {"tz": "UTC"}
    assert deltas[-1]["finish_reason"] == "tool_calls"
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    assert content == ("Sure." if parser == "hermes" else "")


@pytest.mark.parametrize("parser, text", [
    ("hermes", 'Sure.<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'),
    ("pythonic", '[get_time(tz="UTC")]'),
    ("llama3_json", "No call here."),
])
def test_streamed_tool_replies_carry_every_logprob_once(parser, text):
    """With logprobs asked for, a tool reply's stream carries one logprob entry per generated
    token, in order, exactly once, although the reader holds text back (vLLM's stream)."""
    from cadence.engine.outputs import RequestOutput
    from cadence.engine.wire import TokenLogprob
    from cadence.server.serving import ResponseContext
    from cadence.server.serving_chat import ChatRenderer
    from cadence.server.tool_choice import tool_mode

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    render = ChatRenderer(ResponseContext("chatcmpl-1", 0, "m", False, True),
                          tools=tool_mode(tools, "auto", parser))
    pieces = [text[i:i + 2] for i in range(0, len(text), 2)]
    chunks = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        entry = TokenLogprob(token_id=k, logprob=-0.5 - k, top_logprobs=((k, -0.5 - k),),
                             token=piece, top_tokens=(piece,))
        chunks += render.output_chunks(RequestOutput(
            "r", (k,), piece, last, "stop" if last else None, 5, k + 1, 0, logprobs=(entry,)), 0)
    sent = [e for c in chunks if c["choices"][0].get("logprobs")
            for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in sent] == pieces
    assert [e["logprob"] for e in sent] == [-0.5 - k for k in range(len(pieces))]
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in sent)
    # and nothing rides on a chunk when logprobs were not asked for
    plain = ChatRenderer(ResponseContext("chatcmpl-2", 0, "m", False, False),
                         tools=tool_mode(tools, "auto", parser))
    out = plain.output_chunks(RequestOutput("r", (0,), text, True, "stop", 5, 1, 0,
                                            logprobs=(entry,)), 0)
    assert not any(c["choices"][0].get("logprobs") for c in out)
