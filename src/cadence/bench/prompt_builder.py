"""Build a text of an exact token length from a stream of pieces.

Pieces are added while their (cached) counts fit, the rest is filled with one-token pieces, then
the whole text is counted and corrected piece by piece: BPE is close to additive over
space-separated pieces but not exactly (merges across a boundary, a BOS the tokenizer adds), and
the whole-text count is the one that matters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from cadence.bench.token_counter import TokenCounter

# Tried in order as padding; the first that counts as one token is used.
_FILLER_CANDIDATES = (" the", " a", " and", " of", " to", ".", " x")
_MAX_CORRECTIONS = 64


class PromptLengthError(ValueError):
    """The requested length cannot be reached (e.g. shorter than the fixed prefix)."""


@dataclass
class PieceCounts:
    """Memoised token counts of single pieces for one counter (pieces repeat a lot)."""

    counter: TokenCounter
    _cache: dict[str, int] = field(default_factory=dict)

    def __call__(self, piece: str) -> int:
        n = self._cache.get(piece)
        if n is None:
            # Counting "x" + piece minus "x" removes a BOS/prefix the tokenizer may add.
            n = max(self.counter.count("x" + piece) - self.counter.count("x"), 0)
            self._cache[piece] = n
        return n

    def filler(self) -> str:
        for cand in _FILLER_CANDIDATES:
            if self(cand) == 1:
                return cand
        raise PromptLengthError("the tokenizer has no one-token filler piece")


def build_text(
    counts: PieceCounts, target_tokens: int, pieces: Iterator[str], prefix: str = ""
) -> tuple[str, int]:
    """Return (text, token count) with text = prefix + pieces, counted as `target_tokens`.

    The count is the counter's count of the whole text; it equals the target unless the
    tokenizer makes that impossible, in which case the closest count found is returned.
    """
    counter = counts.counter
    base = counter.count(prefix)
    if target_tokens < base:
        raise PromptLengthError(f"target {target_tokens} tokens is shorter than the fixed prefix ({base} tokens)")
    parts: list[str] = []
    total = base
    filler = counts.filler()
    while total < target_tokens:
        piece = next(pieces)
        n = counts(piece)
        if n == 0:
            continue
        if total + n > target_tokens:
            parts.extend([filler] * (target_tokens - total))
            total = target_tokens
            break
        parts.append(piece)
        total += n
    # Correct against the whole-text count.
    actual = counter.count(prefix + "".join(parts))
    for _ in range(_MAX_CORRECTIONS):
        if actual == target_tokens:
            break
        if actual > target_tokens and parts:
            parts.pop()
        else:
            parts.append(filler)
        actual = counter.count(prefix + "".join(parts))
    return prefix + "".join(parts), actual
