"""A reply split into reasoning and content while it streams (formats in reasoning_parsers.py).

    split = ReasoningSplitter(fmt)
    piece = split.feed(new_text, num_new_tokens)   # Piece(reasoning, content): safe to send
    piece = split.finish()                         # what was held back, at the end
    reasoning, content = split_reply(fmt, whole_text)

The splitter moves through three phases: opening (the reply may still start with a start
tag: leading whitespace and a possible tag prefix are held), reasoning (up to the first end
tag; a tail that may be the start of an end tag is held), content (the rest, tags included,
as vLLM leaves them). Text is held back only while it could still be a tag, so every split of
the same text into deltas gives the same reasoning and content as the whole text.

Reasoning tokens (vLLM's usage.completion_tokens_details.reasoning_tokens) are counted per
delta: the tokens of a delta that stays inside the reasoning and holds no tag. Exact when each
token comes in its own delta, as decoding sends them; a delta that carries a tag with other
text is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cadence.server.reasoning_parsers import REASONING, ReasoningFormat

_OPENING, _REASONING, _CONTENT = "opening", "reasoning", "content"


@dataclass(frozen=True)
class Piece:
    reasoning: str = ""
    content: str = ""

    def __add__(self, other: Piece) -> Piece:
        return Piece(self.reasoning + other.reasoning, self.content + other.content)


def _held_tail(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `tags`."""
    longest = min(max(len(t) for t in tags) - 1, len(text))
    for n in range(longest, 0, -1):
        tail = text[len(text) - n:]
        if any(t.startswith(tail) for t in tags):
            return n
    return 0


class ReasoningSplitter:
    """One reply's reasoning and content, delta by delta."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self.phase = _OPENING
        self.held = ""  # text not sent yet: it may still be (part of) a tag
        self.had_reasoning = False  # the reply entered its reasoning (it may be empty)
        self.reasoning_tokens = 0

    @property
    def in_content(self) -> bool:
        """The reply reached its content: every later character is content."""
        return self.phase == _CONTENT

    @property
    def deciding(self) -> bool:
        """The reply's opening is still undecided (reasoning or content)."""
        return self.phase == _OPENING

    def _untagged_phase(self) -> str:
        return _REASONING if self.fmt.untagged == REASONING else _CONTENT

    def feed(self, text: str, num_tokens: int = 0) -> Piece:
        self.held += text
        reasoning: list[str] = []
        content: list[str] = []
        saw_tag = False
        while True:
            if self.phase == _OPENING:
                body = self.held.lstrip()
                tag = next((t for t in self.fmt.starts if body.startswith(t)), None)
                if tag is not None:  # the reply opens its reasoning: the tag is dropped
                    self.held, self.phase, saw_tag = body[len(tag):], _REASONING, True
                    self.had_reasoning = True
                    continue
                if not body or any(t.startswith(body) for t in self.fmt.starts):
                    break  # still undecided
                self.phase = self._untagged_phase()
                self.had_reasoning = self.phase == _REASONING
                continue
            if self.phase == _REASONING:
                found = [(at, tag) for tag in self.fmt.ends
                         if (at := self.held.find(tag)) != -1]
                if found:
                    at, tag = min(found)
                    reasoning.append(self.held[:at])
                    self.held, self.phase, saw_tag = self.held[at + len(tag):], _CONTENT, True
                    continue
                keep = _held_tail(self.held, self.fmt.ends)
                reasoning.append(self.held[:len(self.held) - keep])
                self.held = self.held[len(self.held) - keep:]
                break
            content.append(self.held)
            self.held = ""
            break
        inside = self.phase == _REASONING or (self.phase == _OPENING
                                              and self.fmt.untagged == REASONING)
        if inside and not saw_tag:
            self.reasoning_tokens += num_tokens
        return Piece("".join(reasoning), "".join(content))

    def finish(self) -> Piece:
        """The held text at the reply's end: an undecided opening takes the untagged phase,
        a partial end tag stays reasoning."""
        if self.phase == _OPENING:
            self.phase = self._untagged_phase()
            self.had_reasoning = self.phase == _REASONING
        held, self.held = self.held, ""
        return Piece(held, "") if self.phase == _REASONING else Piece("", held)


def split_pieces(fmt: ReasoningFormat,
                 pieces: Iterable[tuple[str, int]]) -> tuple[str | None, str | None, int]:
    """(reasoning, content, reasoning tokens) of a whole reply given as its (text, tokens)
    deltas. reasoning is None when the reply had none (or only an empty block); content is
    None when the reply had reasoning and nothing after it (vLLM's message fields)."""
    splitter = ReasoningSplitter(fmt)
    whole = Piece()
    for text, num_tokens in pieces:
        whole = whole + splitter.feed(text, num_tokens)
    whole = whole + splitter.finish()
    if not splitter.had_reasoning:
        return None, whole.content, 0
    return whole.reasoning or None, whole.content or None, splitter.reasoning_tokens


def split_reply(fmt: ReasoningFormat, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole reply (split_pieces' rules)."""
    reasoning, content, _ = split_pieces(fmt, [(text, 0)])
    return reasoning, content
