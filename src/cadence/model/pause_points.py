"""Where a layer-by-layer forward lets its caller run other work: an interleaved prompt chunk's
pause points (--core-split interleave, engine/split_stepper.py; core/interleave_pace.py).

The forward calls the points object itself at every layer boundary (between two layers and
between a layer's attention and its MLP), as it calls a plain BetweenLayers callback. Where a
layer computes each row the same whatever rows share its ops (LlamaDecoderLayer._blocks), it
also runs those ops over blocks of `row_block` rows and calls `inside()` between two blocks:
that pause runs the hook only when the caller's work is due (a time compare), so a long chunk
pays for the pauses only its block split, and a decode step waits at most about one block,
not one whole layer segment, for its turn.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class PausePoints:
    def __init__(self, hook: Callable[[], None], row_block: int = 0) -> None:
        """hook: the caller's work at a pause. row_block: rows per block of a layer's ops
        (0: layer boundaries only)."""
        self.hook = hook
        self.row_block = row_block
        # perf_counter() time from which the hook is due at a pause inside a layer (the caller
        # sets it from its hook; infinity: never inside).
        self.due_at = math.inf
        # Seconds of the forward's own work since the pause point before the latest one (the
        # hook's measure of how far the next point is).
        self.piece_s = 0.0
        # The longest piece between two row blocks' pauses (one block of an op group).
        self.longest_block_s = 0.0
        # Whether the forward split a layer into row blocks (the caller's chunk sizing learns
        # from it that the layer segment no longer bounds the chunk).
        self.split_rows = False
        self._last = time.perf_counter()

    def __call__(self) -> None:
        """A layer boundary: the hook runs (it decides itself whether its work is due)."""
        self._run(time.perf_counter())

    def inside(self) -> None:
        """Between two row blocks of an op: the hook runs where this pause is the one nearest
        to due_at (the next is about one block away, as far as this one is from the last)."""
        now = time.perf_counter()
        block = now - self._last
        self.longest_block_s = max(self.longest_block_s, block)
        if now + block / 2 >= self.due_at:
            self._run(now)
        else:
            self._last = now

    def _run(self, now: float) -> None:
        self.piece_s = now - self._last
        try:
            self.hook()
        finally:
            self._last = time.perf_counter()
