"""The host tier of the KV cache: blocks a preempted request's KV is swapped out to, instead of
being dropped and recomputed (vLLM v0's swap preemption).

A preempted request whose computed positions are worth more to recompute than to copy (see
`Scheduler._should_swap`: predicted prefill time of its computed tokens vs. copying its blocks
out and back) keeps `num_computed_tokens`; its full device blocks are copied to host blocks
before the step's forward (`StepPlan.swap_out`), its device blocks are freed, and it waits in
the queue like any preempted request. When it is admitted again it gets fresh device blocks and
the host blocks are copied back before that step's forward (`StepPlan.swap_in`); then it
continues from where it stopped. Host block ids index the executor's host KV pool.
"""

from __future__ import annotations


class SwapSpace:
    """Free host blocks and which host blocks each swapped-out request holds."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() takes the lowest id
        self._held: dict[str, list[int]] = {}
        # Released during the step being built: reusable only from the next one (the
        # executor copies this step's swap-outs before its swap-ins, so a block released by
        # a swap-in must not receive another request's swap-out in the same step).
        self._released: list[int] = []
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def holds(self, req_id: str) -> bool:
        return req_id in self._held

    def blocks_of(self, req_id: str) -> list[int]:
        return list(self._held.get(req_id, ()))

    def take(self, req_id: str, num_blocks: int) -> list[int]:
        """Host blocks for a request's swap-out. The caller checked num_free_blocks."""
        if num_blocks > len(self._free) or req_id in self._held:
            raise ValueError(f"cannot swap out {req_id}: {num_blocks} blocks")
        blocks = [self._free.pop() for _ in range(num_blocks)]
        self._held[req_id] = blocks
        self.num_blocks_swapped_out += num_blocks
        return blocks

    def release(self, req_id: str, swapped_in: bool) -> list[int]:
        """Give the request's host blocks back (after its swap-in, or when it ends)."""
        blocks = self._held.pop(req_id, [])
        self._released.extend(reversed(blocks))
        if swapped_in:
            self.num_blocks_swapped_in += len(blocks)
        return blocks

    def end_step(self) -> None:
        """The step's plan is built: blocks released in it become free."""
        self._free.extend(self._released)
        self._released.clear()

    def check_integrity(self) -> None:
        self.end_step()
        held = [b for blocks in self._held.values() for b in blocks]
        if len(held) + len(self._free) != self.num_blocks or len(set(held + self._free)) != (
            self.num_blocks
        ):
            raise RuntimeError("swap space: free + held host blocks do not match the pool")
