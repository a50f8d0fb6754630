"""Reasoning parsers (--reasoning-parser): the whole-reply split, the same split over every
way of cutting the reply into deltas, and the chat / Responses renderers built on them."""

from __future__ import annotations

import json
import random

import pytest

from cadence.engine.outputs import RequestOutput
from cadence.engine.wire import TokenLogprob
from cadence.server.reasoning_parsers import (
    REASONING_PARSERS,
    check_reasoning_parser,
    reasoning_mode,
)
from cadence.server.reasoning_stream import ReasoningSplitter, split_pieces, split_reply
from cadence.server.serving import ResponseContext
from cadence.server.serving_chat import ChatRenderer
from cadence.server.tool_choice import tool_mode

R1 = reasoning_mode("deepseek_r1", {}).format
QWEN3 = reasoning_mode("qwen3", {}).format
QWEN3_OFF = reasoning_mode("qwen3", {"enable_thinking": False}).format
GRANITE = reasoning_mode("granite", {}).format
CALL = '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'

# (format, reply, reasoning, content): vLLM's answers for these replies.
CASES = [
    (R1, "<think>Let me see.</think>It is 4.", "Let me see.", "It is 4."),
    # the template opened <think> in the prompt: the reply has only the end tag
    (R1, "Let me see.\n</think>\n\nIt is 4.", "Let me see.\n", "\n\nIt is 4."),
    (R1, "\n<think>\nhmm</think>", "\nhmm", None),  # nothing after: content null
    (R1, "cut inside the thinking", "cut inside the thinking", None),
    (R1, "partial end </thin", "partial end </thin", None),
    (R1, "a<b and c</think>d</think>e", "a<b and c", "d</think>e"),  # later tags are content
    (QWEN3, "<think>plan</think>answer", "plan", "answer"),
    (QWEN3, "no tags at all", "no tags at all", None),
    (QWEN3_OFF, "no tags at all", None, "no tags at all"),
    (QWEN3_OFF, "<think>plan</think>answer", "plan", "answer"),
    (GRANITE, "Here is my thought process: sum it. Here is my response: 4", " sum it. ", " 4"),
    (GRANITE, "Here's my thought process:x Here's my response:y", "x ", "y"),
    (GRANITE, "Here is the answer: 4", None, "Here is the answer: 4"),
    (GRANITE, "Here is my thought process: still thinking", " still thinking", None),
    # a tool call written inside the reasoning is reasoning, not a call
    (R1, f"<think>maybe {CALL}?</think>{CALL}", f"maybe {CALL}?", CALL),
]


@pytest.mark.parametrize("fmt, text, reasoning, content", CASES)
def test_whole_reply_split(fmt, text, reasoning, content):
    assert split_reply(fmt, text) == (reasoning, content)


def _streamed(fmt, deltas: list[str]) -> tuple[str | None, str | None]:
    split = ReasoningSplitter(fmt)
    reasoning, content = "", ""
    for d in deltas:
        piece = split.feed(d, 1)
        reasoning, content = reasoning + piece.reasoning, content + piece.content
    piece = split.finish()
    reasoning, content = reasoning + piece.reasoning, content + piece.content
    if not split.had_reasoning:
        return None, content
    return reasoning or None, content or None


@pytest.mark.parametrize("fmt, text, reasoning, content", CASES)
def test_every_split_gives_the_whole_reply_split(fmt, text, reasoning, content):
    """Cut at every point (two deltas), character by character, and at random points: the
    streamed reasoning and content are the whole reply's."""
    for cut in range(len(text) + 1):
        assert _streamed(fmt, [text[:cut], text[cut:]]) == (reasoning, content), cut
    assert _streamed(fmt, list(text)) == (reasoning, content)
    rng = random.Random(7)
    for _ in range(30):
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        deltas = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert _streamed(fmt, deltas) == (reasoning, content), deltas


def test_text_is_held_back_only_while_it_may_be_a_tag():
    split = ReasoningSplitter(R1)
    assert split.feed("<thi").reasoning == ""  # may still be <think>
    assert split.feed("nk>ab").reasoning == "ab"
    assert split.feed("c</th").reasoning == "c"  # "</th" may be the end tag
    assert split.feed("ought").reasoning == "</thought"  # it was not
    assert split.feed("</think>ok").content == "ok"
    assert split.feed(" more").content == " more"


def test_reasoning_tokens_counted_per_delta():
    # one token per delta: <think>, 3 reasoning tokens, </think>, 2 content tokens
    deltas = [("<think>", 1), ("a", 1), ("b", 1), ("c", 1), ("</think>", 1), ("x", 1), ("y", 1)]
    assert split_pieces(R1, deltas) == ("abc", "xy", 3)
    # the template opened the block: every token before the end tag is reasoning
    assert split_pieces(R1, [("a", 1), ("b", 1), ("</think>", 1), ("x", 1)]) == ("ab", "x", 2)
    assert split_pieces(QWEN3_OFF, [("a", 1), ("b", 1)]) == (None, "ab", 0)


def test_parser_names_and_template_switches():
    assert sorted(REASONING_PARSERS) == ["deepseek_r1", "deepseek_v3", "granite", "qwen3"]
    with pytest.raises(ValueError, match="deepseek_r1, deepseek_v3, granite, qwen3"):
        check_reasoning_parser("openai_gptoss")
    assert reasoning_mode(None, {}) is None
    assert reasoning_mode("deepseek_v3", {}).format is None  # not thinking: all content
    assert reasoning_mode("deepseek_v3", {"thinking": True}).format == R1
    # reasoning_effort "none" reaches the template as enable_thinking false
    from cadence.server.protocol import chat_template_variables

    off = chat_template_variables(None, None, None, "none")
    assert reasoning_mode("qwen3", off).format == QWEN3_OFF
    # a reply held to a grammar from its first token is content unless it opens a block
    held = reasoning_mode("deepseek_r1", {}, grammar=True).format
    assert split_reply(held, '{"a": 1}') == (None, '{"a": 1}')
    assert split_reply(held, "<think>x</think>y") == ("x", "y")


def test_serve_flag_validates_the_name():
    from cadence.server.cli_serve import server_options_from_vllm

    assert server_options_from_vllm({"reasoning_parser": "qwen3"})["reasoning_parser"] == "qwen3"
    assert "reasoning_parser" not in server_options_from_vllm({"reasoning_parser": ""})
    with pytest.raises(ValueError, match="it has: deepseek_r1"):
        server_options_from_vllm({"reasoning_parser": "nope"})


# ---- the chat renderer -----------------------------------------------------------------------

def _outputs(text: str, step: int, logprobs: bool = False) -> list[RequestOutput]:
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    outs = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        entry = (TokenLogprob(token_id=k, logprob=-1.0 - k, top_logprobs=((k, -1.0 - k),),
                              token=piece, top_tokens=(piece,)),) if logprobs else None
        outs.append(RequestOutput("r", (k,), piece, last, "stop" if last else None, 5, k + 1, 0,
                                  logprobs=entry))
    return outs


def _chat_chunks(render: ChatRenderer, outs: list[RequestOutput]) -> list[dict]:
    return [c["choices"][0] for out in outs for c in render.output_chunks(out, 0)]


@pytest.mark.parametrize("step", [1, 3, 7])
def test_chat_stream_sends_reasoning_then_content_and_reads_calls_in_content_only(step):
    text = f"<think>I could call {CALL} now.</think>Calling.{CALL}"
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    render = ChatRenderer(ResponseContext("chatcmpl-1", 0, "m", False, True),
                          tools=tool_mode(tools, "auto", "hermes"),
                          reasoning=reasoning_mode("deepseek_r1", {}))
    deltas = _chat_chunks(render, _outputs(text, step, logprobs=True))
    reasoning = "".join(d["delta"].get("reasoning") or "" for d in deltas)
    assert reasoning == f"I could call {CALL} now."
    assert all(d["delta"].get("reasoning_content") == d["delta"].get("reasoning")
               for d in deltas)
    kinds = [k for d in deltas for k in ("reasoning", "content", "tool_calls")
             if d["delta"].get(k)]
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert "".join(d["delta"].get("content") or "" for d in deltas) == "Calling."
    calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_time"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"tz": "UTC"}
    assert deltas[-1]["finish_reason"] == "tool_calls"
    # every token's logprob once, in order, although text was held back
    sent = [e["token"] for d in deltas if d.get("logprobs") for e in d["logprobs"]["content"]]
    assert "".join(sent) == text
    assert render.completion_tokens_details()["reasoning_tokens"] > 0


def test_chat_include_reasoning_false_hides_reasoning_logprobs_and_ids():
    ctx = ResponseContext("chatcmpl-1", 0, "m", False, True, return_token_ids=True)
    render = ChatRenderer(ctx, reasoning=reasoning_mode("deepseek_r1", {}, include=False))
    deltas = _chat_chunks(render, _outputs("<think>secret</think>shown", 2, logprobs=True))
    assert not any(d["delta"].get("reasoning") for d in deltas)
    assert "".join(d["delta"].get("content") or "" for d in deltas) == "shown"
    assert not any(d.get("logprobs") or "token_ids" in d for d in deltas)


def test_chat_whole_response_fields_and_usage():
    from cadence.server.generation import CollectedGeneration

    render = ChatRenderer(ResponseContext("chatcmpl-1", 0, "m", False, False),
                          reasoning=reasoning_mode("deepseek_r1", {}))
    results = [CollectedGeneration(text="ab</think>x", finish_reason="stop",
                                   pieces=[("a", 1), ("b", 1), ("</think>", 1), ("x", 1)]),
               CollectedGeneration(text="only thinking", finish_reason="length",
                                   pieces=[("only thinking", 1)])]
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    body = render.whole_response(results, usage)
    first, second = (c["message"] for c in body["choices"])
    assert (first["reasoning"], first["reasoning_content"], first["content"]) == ("ab", "ab", "x")
    assert (second["reasoning"], second["content"]) == ("only thinking", None)
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    # without a reasoning parser nothing changes
    plain = ChatRenderer(ResponseContext("chatcmpl-2", 0, "m", False, False))
    message = plain.whole_response(results[:1], dict(usage))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "ab</think>x"}


# ---- the Responses renderer ------------------------------------------------------------------

def test_responses_reasoning_item_before_the_message():
    from cadence.server.generation import CollectedGeneration
    from cadence.server.serving_responses import ResponsesRenderer

    def renderer():
        return ResponsesRenderer(ResponseContext("resp-1", 0, "m", False, False), echo={},
                                 tools=None, conversation=[], store=None,
                                 reasoning=reasoning_mode("qwen3", {}))

    text = "<think>two and two</think>Four."
    whole = renderer().whole_response(
        [CollectedGeneration(text=text, finish_reason="stop", pieces=[(text, 1)])],
        {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3})
    kinds = [item["type"] for item in whole["output"]]
    assert kinds == ["reasoning", "message"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "two and two"}]
    assert whole["output"][1]["content"][0]["text"] == "Four."

    stream = renderer()
    events = stream.opening_chunks(0)
    for out in _outputs(text, 4):
        events += stream.output_chunks(out, 0)
    names = [e["type"] for e in events]
    assert names.index("response.reasoning_text.done") < names.index(
        "response.output_text.delta")
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.reasoning_text.delta") == "two and two"
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.output_text.delta") == "Four."
    done = events[-1]["response"]
    assert [item["type"] for item in done["output"]] == ["reasoning", "message"]
    assert done["output"][0]["content"][0]["text"] == "two and two"
    assert done["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
