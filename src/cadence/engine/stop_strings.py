"""Stop strings on streamed text: cut exactly before the first completed match, hold back possible starts.

Text arrives in pieces (one detokenized token at a time). A piece may end with the beginning of a
stop string ("Obs" of "Observation:"), which must not reach the client until the next pieces
say whether the stop string completes. So the matcher emits everything except the longest tail
that is a proper prefix of some stop string, and on a match emits the text before it and stops
(OpenAI and vLLM semantics: the stop string itself is not in the output).

Why holding only that tail is enough: a stop string that starts inside already-emitted text
would mean a longer held tail existed at the time, a contradiction; so every future match starts
inside the held text plus the new piece, and only that buffer is searched.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Streaming stop-string filter for one request."""

    def __init__(self, stop: Sequence[str]) -> None:
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty str, got {list(stop)!r}")
        self._stop = tuple(stop)
        self._held = ""
        self.stopped = False

    @property
    def held_text(self) -> str:
        """Text withheld because it may be the start of a stop string."""
        return self._held

    def feed(self, piece: str) -> str:
        """Add a piece of text; return what can be emitted now. Sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self._stop:
            return piece
        buf = self._held + piece
        cut = _earliest_match(buf, self._stop)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        hold = _longest_prefix_tail(buf, self._stop)
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """The stream ended without a match: release the held text."""
        text, self._held = self._held, ""
        return "" if self.stopped else text


def _earliest_match(buf: str, stop: tuple[str, ...]) -> int | None:
    """Start of the stop string that completes first (smallest end; on a tie, earliest start).

    Ordering by end, not start, is what generation does: the request stops at the token that
    completes a stop string, so text after that point is never produced. It also makes the cut
    independent of how the text was split into pieces ("\naa" with stops "a" and "\naa" cuts
    to "\n" whether it arrives whole or as "\na" + "a").
    """
    best: tuple[int, int] | None = None  # (end, start)
    for s in stop:
        i = buf.find(s)
        if i != -1 and (best is None or (i + len(s), i) < best):
            best = (i + len(s), i)
    return None if best is None else best[1]


def _longest_prefix_tail(buf: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of buf that is a proper prefix of some stop string."""
    best = 0
    for s in stop:
        # Only tails shorter than s can be proper prefixes of it; try longest first.
        for n in range(min(len(s) - 1, len(buf)), best, -1):
            if s.startswith(buf[len(buf) - n :]):
                best = n
                break
    return best
