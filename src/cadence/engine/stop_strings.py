"""Stop strings on streamed text: cut exactly before the first completed match, hold back possible starts.

Text arrives in pieces (one detokenized token at a time). A piece may end with the beginning of a
stop string ("Obs" of "Observation:"), which must not reach the client until the next pieces
say whether the stop string completes. So the matcher emits everything except the longest tail
that is a proper prefix of some stop string, and on a match emits the text before it and stops
(OpenAI and vLLM semantics: the stop string itself is not in the output).

Why holding only that tail is enough: a stop string that starts inside already-emitted text
would mean a longer held tail existed at the time, a contradiction; so every future match starts
inside the held text plus the new piece. Matches are found by one automaton per stop string
(Knuth-Morris-Pratt), so a token's work does not grow with the strings' lengths.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Streaming stop-string filter for one request.

    Building it is the setup that grows with the stop strings (a KMP failure table per
    string, O(total length)): the engine builds it at admission, off the step loop. Feeding a
    piece then costs O(len(piece) x number of strings): each string's automaton state (the
    longest tail of the text so far that is a prefix of it) advances one character at a time,
    whatever the strings' lengths.
    """

    def __init__(self, stop: Sequence[str], include_stop: bool = False) -> None:
        if isinstance(stop, str):
            stop = (stop,)  # one stop string, never its characters
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty str, got {list(stop)!r}")
        self._stop = tuple(stop)
        self._fail = tuple(_failure_table(s) for s in self._stop)
        # Per string: how many of its first characters the text so far ends with.
        self._state = [0] * len(self._stop)
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
        state = self._state
        for j in range(len(self._held), len(buf)):
            ch = buf[j]
            done = None
            for i, s in enumerate(self._stop):
                k, fail = state[i], self._fail[i]
                while k and s[k] != ch:
                    k = fail[k - 1]
                if s[k] == ch:
                    k += 1
                if k == len(s):
                    # Completed here; on a tie the longer string started earlier.
                    if done is None or len(s) > len(done):
                        done = s
                    k = fail[k - 1]
                state[i] = k
            if done is not None:
                cut = j + 1 - len(done)
                self.stopped = True
                self.matched = done
                self._held = ""
                return buf[: cut + len(done)] if self._include_stop else buf[:cut]
        # Hold the longest tail that is a proper prefix of some stop string.
        hold = max(state)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """The stream ended without a match: release the held text."""
        text, self._held = self._held, ""
        return "" if self.stopped else text


def _failure_table(s: str) -> list[int]:
    """KMP: fail[i] = length of the longest proper prefix of s[:i + 1] that is also its
    suffix."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail
