"""A deterministic, torch-free stand-in for the model executor (core and engine tests).

It keeps a fake KV cache: for every physical block, the token id written at each slot. A chunk
writes its tokens through its block table, then (when `sample` is set) reads the request's whole
history [0, end_pos) back through the same block table and "samples" a pure function of it.
So, exactly like a real model, the output depends only on the tokens before it, and any
scheduling bug that would corrupt a real KV cache (a wrong block table, a cache hit on a block
whose content differs, a position never computed) changes the output or raises here.
It also records every (req_id, start_pos, end_pos) it computed, in order.
"""

from __future__ import annotations

import hashlib
from array import array

from cadence.core.plan import ScheduledChunk, SampledToken, StepOutput, StepPlan


class FakeExecutorError(RuntimeError):
    """The plan asked for something a real executor could not do (e.g. read unwritten KV)."""


class FakeExecutor:
    """`execute(plan) -> StepOutput` with token = f(request's tokens up to end_pos).

    With `eos_token_id` set, roughly one sampled token in `eos_one_in` is EOS (still a pure
    function of the history), so requests end early as they would with a real model.
    """

    def __init__(self, vocab_size: int, eos_token_id: int | None = None, eos_one_in: int = 16,
                 sliding_window: int | None = None):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if eos_token_id is not None and not 0 <= eos_token_id < vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} outside vocab of {vocab_size}")
        if eos_one_in < 1:
            raise ValueError(f"eos_one_in must be >= 1, got {eos_one_in}")
        self.vocab_size = vocab_size
        # A sliding-window model: a token depends on its position and the last
        # `sliding_window` tokens only, and positions before that window are never read (their
        # blocks may have been given back: the table then holds placeholders there).
        self.sliding_window = sliding_window
        self.eos_token_id = eos_token_id
        self.eos_one_in = eos_one_in
        # block id -> token id per slot (None = never written).
        self._kv: dict[int, list[int | None]] = {}
        # host block id -> contents (the host tier of swap preemption).
        self._host: dict[int, list[int | None]] = {}
        # disk slot -> contents (the disk tier); `disk_fault(op, slot)` -> True makes that
        # write ("write") or read ("read") fail, as a full disk or an unreadable file would.
        self._disk: dict[int, list[int | None]] = {}
        self.disk_fault = None
        # Every chunk computed: (req_id, start_pos, end_pos), in execution order.
        self.computed: list[tuple[str, int, int]] = []
        self.num_steps = 0

    # Like the model executor, execute() may pause between "layers" (an interjection): it
    # calls between_layers this many times after writing the step's KV and before reading it
    # back, so a step run in between that touched this step's blocks changes its tokens.
    can_pause = True
    num_pause_points = 3

    def execute(self, plan: StepPlan, between_layers=None) -> StepOutput:
        sampled: dict[str, SampledToken] = {}
        # Swap preemption: every copy out first (disk, then host), then back in (as the real
        # executor); failed disk I/O leaves the chunks it would feed out of the step.
        failed: list[int] = []
        for dev, slot in plan.disk_out:
            if self.disk_fault is not None and self.disk_fault("write", slot):
                self._disk.pop(slot, None)
                failed.append(slot)
            else:
                self._disk[slot] = list(self._kv.get(dev, ()))
        for dev, host in plan.swap_out:
            self._host[host] = list(self._kv.get(dev, ()))
        for host, dev in plan.swap_in:
            if host not in self._host:
                raise FakeExecutorError(f"swap-in of host block {host} that holds nothing")
            self._kv[dev] = list(self._host[host])
        unread: set[int] = set()
        for slot, dev in plan.disk_in:
            if slot not in self._disk or (self.disk_fault is not None
                                          and self.disk_fault("read", slot)):
                failed.append(slot)
                unread.add(dev)
            else:
                self._kv[dev] = list(self._disk[slot])
        for slot in plan.disk_discard:
            self._disk.pop(slot, None)
        skipped = tuple(c.req_id for c in plan.chunks if unread.intersection(c.block_table))
        for chunk in plan.chunks:
            if chunk.req_id in skipped:
                continue
            self._write(chunk, plan.block_size)
            self.computed.append((chunk.req_id, chunk.start_pos, chunk.end_pos))
        if between_layers is not None:
            for _ in range(self.num_pause_points):
                between_layers()
        # Read after all writes, as a real forward writes a layer's KV before attending.
        for chunk in plan.chunks:
            if chunk.sample and chunk.req_id not in skipped:
                history = self._read(chunk, plan.block_size)
                sampled[chunk.req_id] = SampledToken(self.next_token(history))
        self.num_steps += 1
        return StepOutput(step_id=plan.step_id, sampled=sampled,
                          failed_disk_slots=tuple(failed), skipped_req_ids=skipped,
                          io_error="injected disk fault" if failed else "")

    @property
    def num_disk_files(self) -> int:
        """Disk slots holding contents (a real executor's files)."""
        return len(self._disk)

    def next_token(self, history: list[int | None]) -> int:
        """The fake model: a pure function of the whole token history (with a sliding window,
        of its length and its last `sliding_window` tokens)."""
        if self.sliding_window is not None:
            history = [len(history), *history[-self.sliding_window:]]
        digest = hashlib.blake2b(array("q", history).tobytes(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        if self.eos_token_id is not None and value % self.eos_one_in == 0:
            return self.eos_token_id
        return (value // self.eos_one_in) % self.vocab_size

    def reference_generate(self, prompt: list[int], num_tokens: int, stop_ids=()) -> list[int]:
        """Tokens an unscheduled run would produce (up to num_tokens, stopping after a stop id)."""
        history, out = list(prompt), []
        while len(out) < num_tokens:
            token = self.next_token(history)
            out.append(token)
            history.append(token)
            if token in stop_ids:
                break
        return out

    # -- the fake KV cache ------------------------------------------------------------------
    def export_blocks(self, block_ids) -> list[list[int | None]]:
        """Contents of blocks (a KV transfer's source side in tests)."""
        return [list(self._kv.get(b, ())) for b in block_ids]

    def import_blocks(self, block_ids, contents) -> None:
        """Overwrite blocks with exported contents (a KV transfer's destination side)."""
        for b, data in zip(block_ids, contents, strict=True):
            self._kv[b] = list(data)

    def _check_table(self, chunk: ScheduledChunk, block_size: int) -> None:
        needed = -(-chunk.end_pos // block_size)
        if len(chunk.block_table) < needed:
            raise FakeExecutorError(
                f"{chunk.req_id}: block table of {len(chunk.block_table)} blocks cannot hold "
                f"{chunk.end_pos} positions (block_size {block_size})"
            )
        first = self._first_read_block(chunk, block_size)
        if len(set(chunk.block_table[first:])) != len(chunk.block_table[first:]):
            raise FakeExecutorError(f"{chunk.req_id}: block table repeats a block")

    def _first_read_block(self, chunk: ScheduledChunk, block_size: int) -> int:
        """The first block the chunk's queries can see (0 without a sliding window)."""
        if self.sliding_window is None:
            return 0
        return max(0, chunk.start_pos - self.sliding_window + 1) // block_size

    def _write(self, chunk: ScheduledChunk, block_size: int) -> None:
        self._check_table(chunk, block_size)
        for pos, token in enumerate(chunk.token_ids, start=chunk.start_pos):
            block_id = chunk.block_table[pos // block_size]
            block = self._kv.setdefault(block_id, [None] * block_size)
            block[pos % block_size] = token

    def _read(self, chunk: ScheduledChunk, block_size: int) -> list[int]:
        """Tokens at positions [0, end_pos), gathered block by block through the table (with a
        sliding window: only the last query's window; earlier positions read as 0)."""
        history: list[int | None] = []
        first = 0
        if self.sliding_window is not None:
            first = max(0, chunk.end_pos - self.sliding_window) // block_size
            history.extend([0] * (first * block_size))
        for i in range(first, -(-chunk.end_pos // block_size)):
            block_id = chunk.block_table[i]
            block = self._kv.get(block_id)
            history.extend(block if block is not None else [None] * block_size)
        del history[chunk.end_pos :]
        if None in history:
            pos = history.index(None)
            raise FakeExecutorError(
                f"{chunk.req_id}: position {pos} (block {chunk.block_table[pos // block_size]}, "
                f"slot {pos % block_size}) was never computed"
            )
        return history  # type: ignore[return-value]
