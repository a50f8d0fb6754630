"""Requests whose prompt KV is computed elsewhere (disaggregated decode), and KV leases.

Decode side. A request that arrives with its prompt already prefilled by another engine (its
first output token sampled there) does not go through the normal waiting queue, whose admission
would compute the prompt again. It moves through three places instead:

    queued      -> blocks for its prompt are allocated (prefix-cache hits taken, only the missing
                   blocks are loaded)                                       RemoteKVStage.admit
    loading     -> status WAITING_FOR_REMOTE_KV: a KVLoad tells the engine which local blocks to
                   fill from which remote block ids; the scheduler does not poll it, the engine
                   reports the end of the transfer (`Scheduler.finish_remote_kv`)
    ready       -> the KV is in place; the next schedule() moves it into `running` when a seat
                   is free (num_computed_tokens = prompt length), and it decodes like any other

A loading request is never preempted (a transfer in flight owns its blocks); once running it is
an ordinary request: preemption recomputes prompt and outputs locally.

Prefill side. A request marked `hold_kv_on_finish` keeps its blocks after it finishes: they are
leased (KVCacheManager.lease) until the engine releases them (the decode side acknowledged the
pull, or the lease expired).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.request import Request, RequestStatus


@dataclass(frozen=True)
class KVLoad:
    """Fill local blocks `local_block_ids[i]` with the remote engine's block
    `first_remote_block + i`: the request's prompt blocks that the local prefix cache lacked."""

    req_id: str
    local_block_ids: tuple[int, ...]
    first_remote_block: int
    num_local_hit_tokens: int


class RemoteKVStage:
    """The decode side's queue of prefilled requests, from arrival to `running`."""

    def __init__(self) -> None:
        self.queued: deque[Request] = deque()
        self.loading: dict[str, Request] = {}
        self.ready: deque[Request] = deque()
        self._loads: list[KVLoad] = []

    def __len__(self) -> int:
        return len(self.queued) + len(self.loading) + len(self.ready)

    def __iter__(self):
        yield from self.queued
        yield from self.loading.values()
        yield from self.ready

    @property
    def num_seats(self) -> int:
        """Requests that hold (or are about to take) a running seat."""
        return len(self.loading) + len(self.ready)

    def add(self, req: Request) -> None:
        self.queued.append(req)

    def discard(self, req: Request) -> bool:
        """Forget `req` wherever it is (its blocks are freed by the caller)."""
        if self.loading.pop(req.req_id, None) is not None:
            return True
        for queue in (self.queued, self.ready):
            if req in queue:
                queue.remove(req)
                return True
        return False

    # -- stages of schedule() ---------------------------------------------------------------
    def admit(self, kv: KVCacheManager, seats_left: int, fail, reserved: int = 0) -> None:
        """Give queued requests the blocks of their prompt, in arrival order, while blocks and
        seats last, leaving `reserved` free blocks alone; each becomes WAITING_FOR_REMOTE_KV
        with a KVLoad for the engine. `fail(req, message)` ends one that can never fit."""
        while self.queued and seats_left > self.num_seats:
            req = self.queued[0]
            num_prompt = req.num_prompt_tokens
            if kv.blocks_for_tokens(num_prompt + 1) > kv.num_blocks:
                self.queued.popleft()
                fail(req, f"request {req.req_id} needs {kv.blocks_for_tokens(num_prompt + 1)} "
                          f"KV blocks but the cache has only {kv.num_blocks}")
                continue
            hits = kv.get_computed_blocks(req)
            num_hit_tokens = len(hits) * kv.block_size
            need = kv.num_free_blocks_needed(req, num_prompt - num_hit_tokens, hits)
            if need + reserved > kv.pool.num_free_blocks:
                return  # running requests will free blocks; no overtaking
            self.queued.popleft()
            new_blocks = kv.allocate(req, num_prompt - num_hit_tokens, hits)
            kv.record_prefix_lookup(num_prompt, num_hit_tokens)
            req.num_computed_tokens = num_hit_tokens
            req.num_cached_tokens = num_hit_tokens
            req.status = RequestStatus.WAITING_FOR_REMOTE_KV
            self.loading[req.req_id] = req
            self._loads.append(KVLoad(req.req_id, tuple(new_blocks), len(hits), num_hit_tokens))

    def can_admit_head(self, kv: KVCacheManager) -> bool:
        """Whether the first queued request's prompt blocks are free now."""
        req = self.queued[0]
        hits = kv.get_computed_blocks(req)
        need = kv.num_free_blocks_needed(req, req.num_prompt_tokens - len(hits) * kv.block_size,
                                         hits)
        return need <= kv.pool.num_free_blocks

    def take_loads(self) -> list[KVLoad]:
        """The loads admitted since the last call (of requests still loading)."""
        loads, self._loads = self._loads, []
        return [load for load in loads if load.req_id in self.loading]

    def finish_load(self, req_id: str) -> Request | None:
        req = self.loading.pop(req_id, None)
        if req is None:
            return None
        req.num_computed_tokens = req.num_prompt_tokens
        self.ready.append(req)
        return req

    def check_integrity(self, kv: KVCacheManager) -> None:
        """Queued requests hold nothing; loading and ready ones hold their prompt's blocks."""
        for req in self.queued:
            if req.status is not RequestStatus.WAITING or kv.holds_blocks(req.req_id):
                raise RuntimeError(f"queued remote {req} holds blocks or is not WAITING")
        for req in [*self.loading.values(), *self.ready]:
            if req.status is not RequestStatus.WAITING_FOR_REMOTE_KV:
                raise RuntimeError(f"remote {req} has status {req.status}")
            if len(kv.get_block_table(req.req_id)) < kv.blocks_for_tokens(req.num_prompt_tokens):
                raise RuntimeError(f"remote {req} lacks the blocks of its prompt")

    def start_ready(self, running: list[Request], max_num_seqs: int) -> None:
        """Ready requests join `running` (ahead of new admissions) while seats are free."""
        while self.ready and len(running) < max_num_seqs:
            req = self.ready.popleft()
            req.status = RequestStatus.RUNNING
            running.append(req)
