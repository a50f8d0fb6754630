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
