"""Token logprobs of a Responses output_text (include: ["message.output_text.logprobs"]).

    tokens = ContentTokens(reasoning_format)     # None: no reasoning parser
    content = tokens.feed(entries)               # the entries that are output text, in order
    content += tokens.finish()                   # at the reply's end
    part["logprobs"] = part_logprobs(content)    # on the output_text part (with bytes)
    event["logprobs"] = event_logprobs(content)  # on output_text.delta / .done (no bytes)

Only the output text's tokens are listed: with --reasoning-parser a reply's reasoning tokens
and its think tags are not (vLLM streams logprobs on output_text deltas only, so a streamed
reply's reasoning tokens carry none; its whole reply puts every generated token's on the
output_text part, reasoning included: cadence follows the streamed rule in both, so the
listed tokens always spell the output text).

A reply that ends on a stop token (EOS) does not list it: its text is not output text.

Tokens are told apart token by token with a splitter of their own (reasoning_stream's rules):
a token read while the reply is in its content is content; tokens read while its opening is
undecided wait until it is decided (content without a tag: they are content); a token that
closes the reasoning is a tag (content only if text follows the tag inside it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cadence.engine.wire import TokenLogprob
from cadence.server import response_format as fmt
from cadence.server.reasoning_parsers import ReasoningFormat
from cadence.server.reasoning_stream import ReasoningSplitter


class ContentTokens:
    """Which of a reply's generated tokens are its output text, token by token."""

    def __init__(self, reasoning: ReasoningFormat | None) -> None:
        self._splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self._undecided: list[TokenLogprob] = []  # read while the opening was undecided

    def feed(self, entries: Iterable[TokenLogprob]) -> list[TokenLogprob]:
        split = self._splitter
        if split is None:
            return list(entries)
        content: list[TokenLogprob] = []
        for entry in entries:
            was_content = split.in_content
            piece = split.feed(entry.token, 1)
            if was_content:
                content.append(entry)
            elif split.in_content:
                if split.had_reasoning:  # a closing tag: what waited was reasoning or tags
                    self._undecided.clear()
                    if piece.content:
                        content.append(entry)
                else:  # an untagged opening turned out to be content
                    content += self._undecided + [entry]
                    self._undecided.clear()
            elif split.deciding:
                self._undecided.append(entry)
            else:  # reasoning
                self._undecided.clear()
        return content

    def finish(self) -> list[TokenLogprob]:
        """Tokens still waiting at the reply's end: content if the opening was content."""
        split = self._splitter
        if split is None:
            return []
        split.finish()
        waiting, self._undecided = self._undecided, []
        return waiting if split.in_content and not split.had_reasoning else []


def without_stop_token(entries: Iterable[TokenLogprob], finish_reason: str | None,
                       stop_reason: str | int | None) -> list[TokenLogprob]:
    """A finished reply's entries less the stop token that ended it (EOS or a stop_token_ids
    entry: its text is never output text; vLLM streams none for it). A stop string's token is
    kept: the text before the string is output text."""
    entries = list(entries)
    if finish_reason == "stop" and not isinstance(stop_reason, str) and entries:
        entries.pop()
    return entries


def text_prefix_tokens(entries: list[TokenLogprob], text: str) -> list[TokenLogprob]:
    """The leading entries whose joined tokens stay a prefix of `text` (a reply's content
    before its function calls: the calls' tokens are not output text)."""
    kept: list[TokenLogprob] = []
    joined = ""
    for entry in entries:
        if not text.startswith(joined + entry.token):
            break
        joined += entry.token
        kept.append(entry)
    return kept


def part_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """An output_text part's `logprobs`: token, logprob, bytes and top_logprobs (each with
    token, logprob, bytes), as chat's logprobs.content entries."""
    return fmt.chat_logprobs(entries)["content"] if entries else []


def event_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """output_text.delta / .done `logprobs`: OpenAI's event entries have no bytes."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]}
                              for t in e["top_logprobs"]]}
            for e in part_logprobs(entries)]
