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

    def __init__(self, stop: Sequence[str], include_stop: bool = False) -> None:
        if isinstance(stop, str):
            stop = (stop,)  # one stop string, never its characters
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty str, got {list(stop)!r}")
        self._stop = tuple(stop)
        # vLLM's include_stop_str_in_output: the matched stop string ends the emitted text.
        self._include_stop = include_stop
        self._held = ""
        self.stopped = False
        # The stop string that matched (vLLM's stop_reason), once stopped.
        self.matched: str | None = None

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
        match = _earliest_match(buf, self._stop)
        if match is not None:
            cut, matched = match
            self.stopped = True
            self.matched = matched
            self._held = ""
            return buf[: cut + len(matched)] if self._include_stop else buf[:cut]
        hold = _longest_prefix_tail(buf, self._stop)
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """The stream ended without a match: release the held text."""
        text, self._held = self._held, ""
        return "" if self.stopped else text


def _earliest_match(buf: str, stop: tuple[str, ...]) -> tuple[int, str] | None:
    """(start, string) of the stop string that completes first (smallest end; on a tie,
    earliest start).

    Ordering by end, not start, is what generation does: the request stops at the token that
    completes a stop string, so text after that point is never produced. It also makes the cut
    independent of how the text was split into pieces ("\naa" with stops "a" and "\naa" cuts
    to "\n" whether it arrives whole or as "\na" + "a").
    """
    best: tuple[int, int, str] | None = None  # (end, start, string)
    for s in stop:
        i = buf.find(s)
        if i != -1 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    return None if best is None else (best[1], best[2])


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
