"""responses_logprobs.ContentTokens: which generated tokens are a Responses output_text's,
token by token, for each kind of reply a reasoning parser splits (think tags, untagged
openings either way, tags cut over tokens)."""

from __future__ import annotations

import pytest

from cadence.engine.wire import TokenLogprob
from cadence.server.reasoning_parsers import CONTENT, REASONING, ReasoningFormat
from cadence.server.reasoning_stream import split_reply
from cadence.server.responses_logprobs import (ContentTokens, event_logprobs, part_logprobs,
                                               text_prefix_tokens, without_stop_token)

THINK = ReasoningFormat(("<think>",), ("</think>",), CONTENT)  # tags optional (qwen3's)
OPENED = ReasoningFormat(("<think>",), ("</think>",), REASONING)  # deepseek_r1's


def _entries(tokens: list[str]) -> list[TokenLogprob]:
    return [TokenLogprob(token_id=i, logprob=-0.5 * i, top_logprobs=((i, -0.5 * i),),
                         token=t, top_tokens=(t,)) for i, t in enumerate(tokens)]


def _content_tokens(fmt, tokens: list[str], per_call: int) -> list[str]:
    found = ContentTokens(fmt)
    entries = _entries(tokens)
    out = []
    for at in range(0, len(entries), per_call):  # tokens as engine outputs carry them
        out += found.feed(entries[at:at + per_call])
    return [e.token for e in out + found.finish()]


@pytest.mark.parametrize("fmt,tokens", [
    (THINK, ["<think>", "Let", " me", " see", "</think>", "\n\n", "It", " is", " noon", "."]),
    (THINK, ["  ", "<th", "ink>", "hm", "</", "think", ">", "Yes", "."]),
    (THINK, ["\n", " ", "Hello", " there"]),       # untagged: all content, whitespace too
    (THINK, ["<", "b", ">bold", "</b>"]),           # a tag prefix that was not a tag
    (THINK, ["<think>", "only", " thinking"]),     # no content at all
    (OPENED, ["plan", " it", "</think>", "Done", "."]),
    (OPENED, ["all", " reasoning"]),
    (None, ["<think>", "x", "</think>", "y"]),      # no parser: every token is text
])
@pytest.mark.parametrize("per_call", [1, 3])
def test_content_tokens_spell_the_content(fmt, tokens, per_call):
    content = "".join(tokens) if fmt is None else (split_reply(fmt, "".join(tokens))[1] or "")
    assert "".join(_content_tokens(fmt, tokens, per_call)) == content


def test_function_call_tokens_are_not_text():
    entries = _entries(["Sure", ".", " <tool_call>", '{"a"', ": 1}", "</tool_call>"])
    assert [e.token for e in text_prefix_tokens(entries, "Sure.")] == ["Sure", "."]
    assert text_prefix_tokens(entries, "") == []


def test_stop_token_is_not_text():
    entries = _entries(["Hi", "</s>"])
    assert [e.token for e in without_stop_token(entries, "stop", None)] == ["Hi"]  # EOS
    assert [e.token for e in without_stop_token(entries, "stop", 7)] == ["Hi"]  # stop id
    assert len(without_stop_token(entries, "stop", "</")) == 2  # a stop string's token
    assert len(without_stop_token(entries, "length", None)) == 2


def test_logprob_shapes():
    entries = _entries(["é", "x"])
    part = part_logprobs(entries)
    assert part[0] == {"token": "é", "logprob": 0.0, "bytes": list("é".encode()),
                       "top_logprobs": [{"token": "é", "logprob": 0.0,
                                         "bytes": list("é".encode())}]}
    assert event_logprobs(entries)[1] == {"token": "x", "logprob": -0.5,
                                          "top_logprobs": [{"token": "x", "logprob": -0.5}]}
    assert part_logprobs([]) == [] and event_logprobs([]) == []
