"""The disk tier of the KV cache: block-sized slots in a directory the executor owns
(`--kv-offload-dir`, `--kv-offload-disk-blocks`), used two ways:

- swap preemption when the host tier (core/swap.py) is full or absent and writing the blocks
  out and reading them back is predicted cheaper than recomputing them: the request's full
  blocks go to slots (`StepPlan.disk_out`), it waits keeping `num_computed_tokens`, and its
  slots are read back into fresh device blocks when it is admitted again (`StepPlan.disk_in`);
- prefix-cache spill: a cached device block that allocation evicts is written to a slot
  first, keyed by its block hash (the same chained hash the prefix cache keys device blocks
  by), and a later request whose prefix continues past the device hits into spilled blocks
  reloads them instead of computing them. Spilled blocks are LRU-evicted from the disk
  budget; swapped requests take precedence over them.

Slot ids name files; this module only decides (no I/O). Ordering rules that keep the files
right without the scheduler waiting on the disk (the executor writes every `disk_out` before
it reads any `disk_in` in a step):
- a slot released in a step (swap-in, finish, failed I/O) is reusable only from the next step,
  and so is a prefix slot evicted while a reload of it is planned in this step (pinned);
- a block spilled in a step is visible to lookups only from the next step (after `update`
  has heard whether its write succeeded).
Released slots are listed once in `take_discards` so the executor deletes their files after
the step's writes and reads (a released slot is never written in the step that releases it).
"""

from __future__ import annotations

from collections import OrderedDict

from cadence.core.block_hash import BlockHash


class DiskTier:
    """Free disk slots, the slots each swapped-out request holds, and the spilled prefix
    blocks (hash -> slot, least recently used first)."""

    def __init__(self, num_blocks: int, prefix_spill: bool = True) -> None:
        self.num_blocks = num_blocks
        self.prefix_spill = prefix_spill
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() takes the lowest id
        self._held: dict[str, list[int]] = {}
        self._prefix: OrderedDict[BlockHash, int] = OrderedDict()
        self._pending_prefix: dict[BlockHash, int] = {}
        self._slot_hash: dict[int, BlockHash] = {}
        self._pinned: set[int] = set()  # prefix slots a reload reads in this step
        self._released: list[int] = []
        self._discard: list[int] = []
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.num_swap_preemptions = 0
        self.num_blocks_spilled = 0
        self.num_blocks_reloaded = 0
        self.num_spilled_dropped = 0  # spilled blocks LRU-evicted from the disk budget
        self.num_io_failures = 0

    # -- counts -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_spilled_blocks(self) -> int:
        return len(self._prefix) + len(self._pending_prefix)

    def _evictable(self) -> int:
        return sum(1 for s in self._prefix.values() if s not in self._pinned)

    def has_room(self, num_blocks: int) -> bool:
        """Whether a swap-out of `num_blocks` fits (evicting spilled prefix blocks)."""
        return num_blocks <= len(self._free) + self._evictable()

    # -- swap preemption --------------------------------------------------------------------
    def holds(self, req_id: str) -> bool:
        return req_id in self._held

    def blocks_of(self, req_id: str) -> list[int]:
        return list(self._held.get(req_id, ()))

    def take(self, req_id: str, num_blocks: int) -> list[int]:
        """Slots for a request's swap-out (evicting spilled prefix blocks, oldest first, when
        free slots do not suffice). The caller checked has_room."""
        if req_id in self._held or not self.has_room(num_blocks):
            raise ValueError(f"cannot swap out {req_id} to disk: {num_blocks} blocks")
        while len(self._free) < num_blocks:
            self._drop_oldest_spilled()
        slots = [self._free.pop() for _ in range(num_blocks)]
        self._held[req_id] = slots
        self.num_blocks_swapped_out += num_blocks
        self.num_swap_preemptions += 1
        return slots

    def release(self, req_id: str, swapped_in: bool) -> list[int]:
        """The request's slots go back (after its swap-in, or when it ends or falls back to
        recompute); their files are discarded."""
        slots = self._held.pop(req_id, [])
        self._release_slots(slots)
        if swapped_in:
            self.num_blocks_swapped_in += len(slots)
        return slots

    # -- prefix spill -----------------------------------------------------------------------
    def spill(self, block_hash: BlockHash) -> int | None:
        """A slot to write an evicted prefix block to, or None (already on disk, or the disk
        holds only swapped requests and pinned blocks)."""
        if not self.prefix_spill:
            return None
        if block_hash in self._prefix:
            self._prefix.move_to_end(block_hash)
            return None
        if block_hash in self._pending_prefix:
            return None
        if not self._free:
            if not self._evictable():
                return None
            self._drop_oldest_spilled()
        slot = self._free.pop()
        self._pending_prefix[block_hash] = slot
        self._slot_hash[slot] = block_hash
        self.num_blocks_spilled += 1
        return slot

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self._prefix.get(block_hash)

    def reload(self, block_hash: BlockHash) -> int:
        """Mark a spilled block read in this step (pinned until the step is built; most
        recently used)."""
        slot = self._prefix[block_hash]
        self._prefix.move_to_end(block_hash)
        self._pinned.add(slot)
        self.num_blocks_reloaded += 1
        return slot

    def drop_spilled(self) -> int:
        """Forget every spilled prefix block (the prefix cache was reset)."""
        n = 0
        for block_hash in list(self._prefix):
            if self._prefix[block_hash] not in self._pinned:
                self._drop_hash(block_hash)
                n += 1
        return n

    # -- failures ---------------------------------------------------------------------------
    def owner_of(self, slot: int) -> str | BlockHash | None:
        """The request id holding a slot (swap), or the hash of the prefix block in it."""
        for req_id, slots in self._held.items():
            if slot in slots:
                return req_id
        return self._slot_hash.get(slot)

    def forget_slot(self, slot: int) -> None:
        """A prefix slot whose write or read failed: drop it."""
        block_hash = self._slot_hash.get(slot)
        if block_hash is not None:
            self._drop_hash(block_hash)

    # -- steps ------------------------------------------------------------------------------
    def end_step(self) -> None:
        """The step's plan is built: spilled blocks become visible, released slots free."""
        for block_hash, slot in self._pending_prefix.items():
            self._prefix[block_hash] = slot
        self._pending_prefix.clear()
        self._free.extend(self._released)
        self._released.clear()
        self._pinned.clear()

    def take_discards(self) -> tuple[int, ...]:
        out, self._discard = tuple(self._discard), []
        return out

    def _release_slots(self, slots: list[int]) -> None:
        self._released.extend(reversed(slots))
        self._discard.extend(slots)

    def _drop_hash(self, block_hash: BlockHash) -> None:
        slot = self._prefix.pop(block_hash, None)
        if slot is None:
            slot = self._pending_prefix.pop(block_hash)
        del self._slot_hash[slot]
        if slot in self._pinned:
            self._released.append(slot)  # read in this step: not reusable before the next
            self._discard.append(slot)
        else:
            # Free at once; its file stays until the next write replaces it (a discard here
            # could delete that write: discards run after the step's writes and reads).
            self._free.append(slot)

    def _drop_oldest_spilled(self) -> None:
        for block_hash, slot in self._prefix.items():
            if slot not in self._pinned:
                self._prefix.pop(block_hash)
                del self._slot_hash[slot]
                self._free.append(slot)
                self.num_spilled_dropped += 1
                return
        raise ValueError("no spilled prefix block to evict")

    def check_integrity(self) -> None:
        self.end_step()
        held = [s for slots in self._held.values() for s in slots]
        spilled = list(self._prefix.values())
        every = held + spilled + self._free
        if len(every) != self.num_blocks or len(set(every)) != self.num_blocks:
            raise RuntimeError("disk tier: free + held + spilled slots do not match the budget")
        if set(self._slot_hash) != set(spilled):
            raise RuntimeError("disk tier: slot -> hash map does not match the spilled blocks")
