"""The stages a policy composes into one step: serve running requests, admit waiting ones.

A StepBuilder lives for one `Scheduler.schedule()` call. It owns the step's token budget and
sequence cap, takes blocks for every token it schedules, preempts (by recompute) when blocks
run out, and finally freezes what it scheduled into a StepPlan. Policies decide only the order
of the stages and how many tokens each request gets (a ChunkRule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cadence.core.disk_tier import DiskTier
from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.request import Request, RequestStatus
from cadence.core.request_queue import RankKey, WaitingQueue
from cadence.core.swap import SwapSpace

# (tokens the request still needs, token budget left, nothing scheduled yet) -> tokens to
# schedule now; 0 means "not this step".
ChunkRule = Callable[[int, int, bool], int]


class StepBuilder:
    def __init__(
        self,
        *,
        kv: KVCacheManager,
        running: list[Request],
        waiting: WaitingQueue,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        rank: Callable[[Request], RankKey],
        fail: Callable[[Request, str], None],
        preempted_before: Iterable[str] = (),
        swap: SwapSpace | None = None,
        choose_tier: Callable[[Request, int], str | None] | None = None,
        disk: DiskTier | None = None,
    ) -> None:
        self._kv = kv
        self._running = running
        self._waiting = waiting
        self._max_num_seqs = max_num_seqs
        self._rank = rank
        self._fail = fail
        self.token_budget = max_num_batched_tokens
        self._max_chunk = max_num_batched_tokens  # the largest chunk a step gives a request
        # req_id -> (request, tokens this step), in batch order.
        self._scheduled: dict[str, tuple[Request, int]] = {}
        self.preempted: list[str] = []
        # Preemptions that made room for a higher-priority waiting request: they do not
        # mean "memory is tight" to admit_waiting (the room is for admitting).
        self._num_preempted_for_room = 0
        # The waiting request make_room_for_waiting preempted for: no lower-ranked request may
        # overtake it into that room (or the next step preempts again, and so on forever).
        self._room_for: Request | None = None
        # Preempted by an earlier build of this same step (the scheduler rebuilds after a
        # request failed): they stay out of this step too.
        self._preempted_before = frozenset(preempted_before)
        # The waiting request _admit is sizing a chunk for (peek_waiting returns it).
        self._admitting: Request | None = None
        # Swap preemption (core/swap.py, core/disk_tier.py): the host and disk tiers, the
        # cost choice ((request, full blocks) -> "host" | "disk" | None = recompute), this
        # step's copies; the disk tier also serves prefix reloads.
        self._swap = swap
        self._choose_tier = choose_tier
        self._disk = disk
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.disk_out: list[tuple[int, int]] = []
        self.disk_in: list[tuple[int, int]] = []
        self._swapped_in: set[str] = set()

    @property
    def is_empty(self) -> bool:
        return not self._scheduled

    @property
    def scheduled_requests(self) -> list[Request]:
        """The requests with tokens in this step so far, in batch order."""
        return [request for request, _ in self._scheduled.values()]

    def running_by_rank(self) -> list[Request]:
        """Running requests, most important first (the preemption victim is the last)."""
        return sorted(self._running, key=self._rank)

    @property
    def running(self) -> list[Request]:
        """Running requests (those admitted in this step included), in admission order."""
        return list(self._running)

    def peek_waiting(self) -> Request | None:
        """The waiting request being admitted (while a chunk rule runs), else the head of the
        queue (None when none waits): a chunk rule may read it, e.g. to know where the chunk
        it sizes starts."""
        if self._admitting is not None:
            return self._admitting
        return self._waiting.peek() if self._waiting else None

    # -- stages -----------------------------------------------------------------------------
    def make_room_for_waiting(self) -> None:
        """Preempt running requests that rank below the head of the waiting queue while the
        head cannot be admitted (the sequence cap is full, or the free blocks do not hold its
        first chunk), so that it starts in this step. Only meaningful with a rank in which a
        waiting request can outrank a running one (priority scheduling): with FCFS the head
        never ranks above a running request."""
        while self._waiting and self._running:
            head = self._waiting.peek()
            victim = max(self._running, key=self._rank)
            if self._rank(head) >= self._rank(victim):
                return
            if self._never_fits(head.num_tokens):
                return  # it can never fit: admit_waiting fails it, nobody makes room
            seat_free = len(self._running) < self._max_num_seqs
            computed = self._kv.get_computed_blocks(head)
            hit_tokens = len(computed) * self._kv.block_size
            first_chunk = max(1, min(head.num_tokens - hit_tokens, self.token_budget))
            if seat_free and self._kv.num_free_blocks_needed(
                head, first_chunk, computed
            ) <= self._kv.pool.num_free_blocks:
                return
            self._preempt(victim)
            self._num_preempted_for_room += 1
            self._room_for = head

    def schedule_running(self, order: Iterable[Request], rule: ChunkRule) -> None:
        """Give running requests their next tokens in `order`, preempting when blocks run out."""
        for request in order:
            if self.token_budget <= 0:
                return
            if request.status is not RequestStatus.RUNNING or request.req_id in self._scheduled:
                continue  # preempted earlier in this step, or already served
            num_new = rule(request.num_remaining_tokens, self.token_budget, self.is_empty)
            if num_new <= 0:
                continue
            if self._allocate_or_preempt(request, num_new):
                self._add(request, num_new)

    def continue_without_preempting(self, order: Iterable[Request], rule: ChunkRule,
                                    reserved: int = 0) -> None:
        """Give running requests (not necessarily in this builder's running list) their next
        chunk in `order` from free blocks only, leaving `reserved` of them untouched; a request
        whose chunk does not fit is passed over (the split engine's prefill stream: another
        stream's requests may not be preempted from here)."""
        for request in order:
            if self.token_budget <= 0:
                return
            if request.status is not RequestStatus.RUNNING or request.req_id in self._scheduled:
                continue
            num_new = rule(request.num_remaining_tokens, self.token_budget, self.is_empty)
            if num_new <= 0:
                continue
            if not self._kv.holds_enough(request, num_new):
                if (self._kv.num_free_blocks_needed(request, num_new) + reserved
                        > self._kv.pool.num_free_blocks):
                    continue
                self._kv.allocate(request, num_new)
            self._add(request, num_new)

    def admit_waiting_where(self, rule: ChunkRule, accept: Callable[[Request], bool],
                            reserved: int = 0) -> None:
        """Admit waiting requests that `accept` (asked just before each admission, so it can
        count what this step admitted already) in queue order, overtaking the ones it
        refuses; stop at the first accepted one that does not fit (budget, seats, blocks).
        `reserved`: free blocks to leave untouched (see admit_waiting)."""
        if len(self.preempted) > self._num_preempted_for_room:
            return
        for request in list(self._waiting):
            if self.token_budget <= 0 or len(self._running) >= self._max_num_seqs:
                return
            if request.req_id in self.preempted or request.req_id in self._preempted_before:
                continue
            if not accept(request):
                continue
            room_for = self._room_for
            if (room_for is not None and room_for is not request
                    and room_for.status is not RequestStatus.RUNNING
                    and self._rank(request) > self._rank(room_for)):
                continue  # the room was made for a higher-ranked request
            if not self._admit(request, rule, reserved=reserved):
                return

    def admit_waiting(self, rule: ChunkRule, reserve_for_running: bool = False) -> None:
        """Admit waiting requests in queue order until the budget, the sequence cap or the
        blocks run out. The head of the queue blocks the rest (no overtaking).

        `reserve_for_running`: leave the blocks that running requests' next token needs (for a
        policy that admits before it serves running requests, so an admission is not undone
        by a preemption in the same step)."""
        if len(self.preempted) > self._num_preempted_for_room:
            return  # memory is tight this step; admitting would only preempt again
        reserved = 0
        if reserve_for_running:
            reserved = sum(self._kv.num_free_blocks_needed(r, 1) for r in self._running)
        while self._waiting and self.token_budget > 0 and len(self._running) < self._max_num_seqs:
            request = self._waiting.peek()
            if request.req_id in self.preempted or request.req_id in self._preempted_before:
                return  # made room for others this step; it comes back in a later one
            if self._never_fits(request.num_tokens):
                self._admit(request, rule, reserved)  # fails it
                continue
            if not self._admit(request, rule, reserved):
                return

    def _admit(self, request: Request, rule: ChunkRule, reserved: int) -> bool:
        """Move one waiting request to running with its first chunk; False when it does not
        fit this step (it stays waiting). One that can never fit the cache is failed."""
        if self._never_fits(request.num_tokens):
            self._waiting.remove(request)
            self._fail(request, self._too_big_message(request, request.num_tokens))
            return False
        on_host = self._swap is not None and self._swap.holds(request.req_id)
        on_disk = self._disk is not None and self._disk.holds(request.req_id)
        swapped = on_host or on_disk
        reload_slots: list[int] = []
        if swapped:
            # Its KV comes back from a tier: no prefix lookup, it resumes where it was.
            computed_blocks: list[int] = []
            num_hit_tokens = request.num_computed_tokens
        else:
            computed_blocks = self._kv.get_computed_blocks(request)
            reload_hashes = self._disk_prefix_hits(request, len(computed_blocks))
            num_hit_tokens = (len(computed_blocks) + len(reload_hashes)) * self._kv.block_size
        self._admitting = request
        try:
            num_new = rule(request.num_tokens - num_hit_tokens, self.token_budget, self.is_empty)
        finally:
            self._admitting = None
        if num_new <= 0:
            return False
        # Prefix blocks reloaded from disk land in new device blocks: allocated like tokens.
        reload_tokens = 0 if swapped else len(reload_hashes) * self._kv.block_size
        need = self._kv.num_free_blocks_needed(request, num_new + reload_tokens, computed_blocks)
        if need + reserved > self._kv.pool.num_free_blocks:
            return False
        self._waiting.remove(request)
        if swapped:
            self._kv.allocate(request, num_new)
            device = self._kv.get_block_table(request.req_id)
            if on_host:
                host = self._swap.release(request.req_id, swapped_in=True)
                self.swap_in.extend(zip(host, device))
            else:
                slots = self._disk.release(request.req_id, swapped_in=True)
                self.disk_in.extend(zip(slots, device))
            self._swapped_in.add(request.req_id)
            request.status = RequestStatus.RUNNING
            self._running.append(request)
            self._add(request, num_new)
            return True
        # Pinned before allocating: an eviction that allocation spills must not reuse them.
        reload_slots = [self._disk.reload(h) for h in reload_hashes]
        new_blocks = self._kv.allocate(request, num_new + reload_tokens, computed_blocks)
        self.disk_in.extend(zip(reload_slots, new_blocks))
        self._kv.record_prefix_lookup(request.num_tokens, num_hit_tokens)
        request.num_computed_tokens = num_hit_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit_tokens
        request.status = RequestStatus.RUNNING
        self._running.append(request)
        self._add(request, num_new)
        return True

    # -- the plan ---------------------------------------------------------------------------
    def build_plan(
        self,
        step_id: int,
        preempted: list[str] | None = None,
        swap_out: list[tuple[int, int]] | None = None,
        swap_in: list[tuple[int, int]] | None = None,
        disk_out: list[tuple[int, int]] | None = None,
        disk_in: list[tuple[int, int]] | None = None,
        disk_discard: tuple[int, ...] = (),
    ) -> StepPlan:
        """Freeze the scheduled work; `preempted` and the swaps default to this builder's
        (the scheduler passes those of every build of the step)."""
        chunks = []
        for request, num_new in self._scheduled.values():
            start = request.num_computed_tokens
            end = start + num_new
            is_decode = num_new == 1 and request.is_prefill_done and request.num_output_tokens > 0
            chunks.append(
                ScheduledChunk(
                    req_id=request.req_id,
                    token_ids=tuple(request.all_token_ids[start:end]),
                    start_pos=start,
                    block_table=self._kv.get_block_table(request.req_id),
                    sample=end == request.num_tokens,
                    sampling=request.sampling,
                    output_index=request.num_output_tokens,
                    is_prefill=not is_decode,
                    history=request.all_token_ids if request.sampling.needs_history else None,
                    num_prompt_tokens=request.num_prompt_tokens,
                    prompt_targets=_prompt_targets(request, start, end),
                )
            )
        return StepPlan(
            step_id=step_id,
            chunks=tuple(chunks),
            block_size=self._kv.block_size,
            preempted=tuple(self.preempted if preempted is None else preempted),
            swap_out=tuple(self.swap_out if swap_out is None else swap_out),
            swap_in=tuple(self.swap_in if swap_in is None else swap_in),
            disk_out=tuple(self.disk_out if disk_out is None else disk_out),
            disk_in=tuple(self.disk_in if disk_in is None else disk_in),
            disk_discard=tuple(disk_discard),
        )

    # -- helpers ----------------------------------------------------------------------------
    def _add(self, request: Request, num_new: int) -> None:
        self._scheduled[request.req_id] = (request, num_new)
        self.token_budget -= num_new

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Take blocks for `num_new` more tokens of a running request, preempting the lowest
        ranked running requests (possibly `request` itself) until they fit."""
        if self._kv.holds_enough(request, num_new):
            return True
        required = self._kv.num_blocks_required(request, num_new)
        if required - self._kv.num_dropped_blocks(request.req_id) > self._kv.num_blocks:
            # No amount of preemption helps: finish it now rather than spin.
            num_tokens = request.num_computed_tokens + num_new
            self._fail(request, self._too_big_message(request, num_tokens))
            return False
        while not self._kv.can_allocate(request, num_new):
            victim = max(self._running, key=self._rank)
            self._preempt(victim)
            if victim is request:
                return False
        self._kv.allocate(request, num_new)
        return True

    def _preempt(self, request: Request) -> None:
        """Preempt: free its blocks and requeue it at the front. By recompute (its KV is
        forgotten; its output tokens stay and are recomputed as part of its sequence later),
        or by swap when the scheduler's cost choice says copying is cheaper (its full blocks
        go to the host tier before this step's forward; it resumes where it was)."""
        scheduled = self._scheduled.pop(request.req_id, None)
        if scheduled is not None:
            self.token_budget += scheduled[1]
        # Only whole blocks are swapped: a partial last block is recomputed (a few tokens).
        num_full = request.num_computed_tokens // self._kv.block_size
        if request.req_id in self._swapped_in:
            # Swapped in earlier in this very step: its copy back is cancelled and it is
            # recomputed (its device blocks hold nothing yet).
            device_blocks = set(self._kv.get_block_table(request.req_id))
            self.swap_in = [(h, d) for h, d in self.swap_in if d not in device_blocks]
            self.disk_in = [(s, d) for s, d in self.disk_in if d not in device_blocks]
            self._swapped_in.discard(request.req_id)
            num_full = 0
        elif self.disk_in and request.num_computed_tokens and request in self._running:
            # Admitted in this step with prefix blocks reloaded from disk: their reads are
            # cancelled and it is recomputed (the device blocks hold nothing yet).
            device_blocks = set(self._kv.get_block_table(request.req_id))
            if any(d in device_blocks for _, d in self.disk_in):
                self.disk_in = [(s, d) for s, d in self.disk_in if d not in device_blocks]
                num_full = 0
        tier = None
        if num_full and self._choose_tier is not None:
            tier = self._choose_tier(request, num_full)
        device = self._kv.get_block_table(request.req_id)[:num_full]
        if tier == "host":
            self.swap_out.extend(zip(device, self._swap.take(request.req_id, num_full)))
        elif tier == "disk":
            self.disk_out.extend(zip(device, self._disk.take(request.req_id, num_full)))
        kept = num_full * self._kv.block_size if tier else 0
        self._kv.free(request)
        self._running.remove(request)
        request.num_computed_tokens = kept
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self._waiting.add_front(request)
        self.preempted.append(request.req_id)

    def _disk_prefix_hits(self, request: Request, num_device_hits: int) -> list:
        """Hashes of the spilled prefix blocks that continue the request's device hits (the
        same cap as device hits: its last token is always computed)."""
        if self._disk is None or not self._kv.enable_prefix_caching or (
                request.num_computed_tokens) or not request.takes_prefix_hits:
            return []
        max_hit_blocks = (request.num_tokens - 1) // self._kv.block_size
        hashes = []
        for block_hash in request.block_hashes[num_device_hits:max_hit_blocks]:
            if self._disk.lookup(block_hash) is None:
                break
            hashes.append(block_hash)
        return hashes

    def _never_fits(self, num_tokens: int) -> bool:
        """Whether a sequence of num_tokens can never hold its blocks, whatever is freed."""
        return self._kv.max_live_blocks(num_tokens, self._max_chunk) > self._kv.num_blocks

    def _too_big_message(self, request: Request, num_tokens: int) -> str:
        needed = self._kv.max_live_blocks(num_tokens, self._max_chunk)
        return (
            f"request {request.req_id} needs {needed} KV cache blocks for {num_tokens} tokens "
            f"but the cache has only {self._kv.num_blocks} blocks of {self._kv.block_size} "
            "tokens; raise num_blocks / kv cache memory or shorten the request"
        )


def _prompt_targets(request: Request, start: int, end: int) -> tuple[int, ...]:
    """The prompt tokens that positions [start, end) predict, for a request that asks for
    prompt logprobs: position p predicts prompt token p + 1 (the last prompt position predicts
    an output token, which is sampled, not scored). Empty once it has an output token: its
    prompt was scored whole by then, and a recompute after preemption need not score it again."""
    if request.sampling.prompt_logprobs is None or request.num_output_tokens:
        return ()
    stop = min(end, request.num_prompt_tokens - 1)
    if start >= stop:
        return ()
    return tuple(request.prompt_token_ids[start + 1:stop + 1])
