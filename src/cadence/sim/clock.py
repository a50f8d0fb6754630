"""Simulated time: the simulator's clock moves only when a step's cost is charged to it."""

from __future__ import annotations

import math


class VirtualClock:
    """Seconds since the start of a simulation. Callable, like time.monotonic, so it can stand
    in for an engine clock."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (>= 0); returns the new time."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"the clock only moves forward by a finite time, got {seconds!r}")
        self._now += seconds
        return self._now

    def advance_to(self, t: float) -> float:
        """Jump to time `t` if it is later than now (idle until an arrival)."""
        if not math.isfinite(t):
            raise ValueError(f"cannot jump to {t!r}")
        self._now = max(self._now, float(t))
        return self._now
