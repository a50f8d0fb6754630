"""Where a layer-by-layer forward lets its caller run other work: an interleaved prompt chunk's
pause points (--core-split interleave, engine/split_stepper.py; core/interleave_pace.py).

The forward calls the points object itself at every layer boundary (between two layers and
between a layer's attention and its MLP), as it calls a plain BetweenLayers callback. Where a
layer computes each row the same whatever rows share its ops (LlamaDecoderLayer._splits_rows), it
also runs those ops over row blocks (row_slices) and calls `inside()` between two blocks: that
pause runs the hook only when the caller's work is due (a time compare), so a long chunk pays
for the pauses only its block split, and a decode step waits at most about one block, not one
whole layer segment, for its turn.

The blocks are sized from the time they take, op group by op group (a layer's attention, its
MLP): each group's blocks are the size whose slowest block, at the previous group of its kind's
slowest seconds per row, takes `block_s`. A size fixed per chunk from an earlier chunk's blocks
ran long (issue 34, SmolLM2 doc-burst: 15-18 ms blocks for a 10 ms target in the chunk after a
512-token first one, whose attention rows had short contexts), and a block the host preempted
once shrank every later chunk's blocks; here such a block shrinks one layer's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class PausePoints:
    def __init__(self, hook: Callable[[], None], row_block: int = 0, block_s: float = 0.0,
                 min_rows: int = 1) -> None:
        """hook: the caller's work at a pause. row_block: rows per block of a layer's ops
        (0: layer boundaries only). block_s > 0: the seconds a block should take; the blocks
        adapt to it (row_slices), none under min_rows, and row_block sizes only the first op
        group of each kind."""
        self.hook = hook
        self.row_block = row_block
        self.block_s = block_s
        self.min_rows = min_rows
        # perf_counter() time from which the hook is due at a pause inside a layer (the caller
        # sets it from its hook; infinity: never inside).
        self.due_at = math.inf
        # Seconds of the forward's own work since the pause point before the latest one (the
        # hook's measure of how far the next point is).
        self.piece_s = 0.0
        # Whether the forward split a layer into row blocks (the caller's chunk sizing learns
        # from it that the layer segment no longer bounds the chunk).
        self.split_rows = False
        # Seconds per row of the slowest block in the latest op group of each kind (attention,
        # mlp): a layer's attention rows get slower along the chunk (each attends to all the
        # rows before it), so its last block sets the rate; the previous layer's is this one's.
        self.s_per_row: dict[str, float] = {}
        # The op group in progress: [kind, block sizes, blocks done, slowest seconds per row].
        self._group: list | None = None
        self._last = time.perf_counter()

    def row_slices(self, total: int, kind: str) -> list[slice]:
        """The row blocks of an op group of `kind` over `total` rows, in order: blocks whose
        slowest one is expected to take block_s (from the latest group of that kind; row_block
        before one was measured, or without block_s), of even size (no short last block)."""
        self.split_rows = True
        rate = self.s_per_row.get(kind) if self.block_s > 0 else None
        size = self.row_block if not rate else max(self.min_rows, int(self.block_s / rate))
        size = max(1, min(total, size))
        count = -(-total // size)
        size = -(-total // count)
        slices = [slice(start, min(start + size, total)) for start in range(0, total, size)]
        self._group = [kind, [s.stop - s.start for s in slices], 0, 0.0]
        return slices

    def __call__(self) -> None:
        """A layer boundary: the hook runs (it decides itself whether its work is due)."""
        now = time.perf_counter()
        if self._group is not None:  # its last block ends here
            self._block_ended(now - self._last)
            kind, _, _, slowest = self._group
            self.s_per_row[kind] = slowest
            self._group = None
        self._run(now)

    def inside(self) -> None:
        """Between two row blocks of an op: the hook runs where this pause is the one nearest
        to due_at (the next is about one block away, as far as this one is from the last)."""
        now = time.perf_counter()
        block = now - self._last
        if self._group is not None:
            self._block_ended(block)
        if now + block / 2 >= self.due_at:
            self._run(now)
        else:
            self._last = now

    def _block_ended(self, seconds: float) -> None:
        group = self._group
        sizes, done = group[1], group[2]
        if done < len(sizes):
            group[3] = max(group[3], seconds / sizes[done])
            group[2] = done + 1

    def _run(self, now: float) -> None:
        self.piece_s = now - self._last
        try:
            self.hook()
        finally:
            self._last = time.perf_counter()
