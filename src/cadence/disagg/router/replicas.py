"""Which replica serves a request: `round-robin`, `least-loaded` or `cache-aware`.

cache-aware weighs, per worker, in prompt tokens:

    cost = miss * (1 + streams) + load_weight * queued
           miss    = prompt tokens beyond the longest prefix the worker holds (what it must
                     prefill; the hit comes from its KV events, or, while those are not to
                     be trusted, from the prefixes this router sent there: session affinity)
           streams = requests this router has in flight there: each one stalls while the
                     miss is prefilled (the interference the request causes there)
           queued  = tokens this router has in flight there (prompts + expected outputs)

and takes the cheapest; a worker whose KV cache is nearly full (scraped) pays its whole
prompt, as its cached blocks are about to be evicted. `load_weight` trades cache hits against
balance: 0 follows the cache alone, large values make it least-loaded.
Healthy workers always come before failed ones; the order returned is also the failover
order (a worker that cannot be reached is replaced by the next).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from cadence.core.block_hash import BlockHash, extend_block_hashes
from cadence.disagg.kv_events import CachedPrefixes
from cadence.disagg.router.config import REPLICA_POLICIES
from cadence.disagg.router.workers import Worker

# Session affinity records this many block hashes per worker (least recently sent dropped),
# of blocks of AFFINITY_BLOCK_SIZE tokens: its own size, so the record stays comparable
# whether or not (and before) the workers' block size is known from their events.
AFFINITY_BLOCKS = 200_000
AFFINITY_BLOCK_SIZE = 16
KV_NEARLY_FULL = 0.95


class PromptBlocks:
    """A request's prompt token ids and their chained block hashes, per block size (computed
    once per size)."""

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = token_ids
        self._hashes: dict[int, list[BlockHash]] = {}

    def __len__(self) -> int:
        return len(self.token_ids)

    def hashes(self, block_size: int) -> list[BlockHash]:
        if block_size not in self._hashes:
            out: list[BlockHash] = []
            extend_block_hashes(out, self.token_ids, block_size)
            self._hashes[block_size] = out
        return self._hashes[block_size]


class SentPrefixes:
    """The prefix blocks this router sent to one worker (LRU): the fallback without events."""

    def __init__(self, capacity: int = AFFINITY_BLOCKS) -> None:
        self.capacity = capacity
        self.hashes: OrderedDict[BlockHash, None] = OrderedDict()

    def add(self, block_hashes: list[BlockHash]) -> None:
        for h in block_hashes:
            self.hashes[h] = None
            self.hashes.move_to_end(h)
        while len(self.hashes) > self.capacity:
            self.hashes.popitem(last=False)

    def longest_prefix_blocks(self, block_hashes: list[BlockHash]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self.hashes:
                break
            n += 1
        return n


class ReplicaSelector:
    def __init__(self, policy: str, load_weight: float = 1.0) -> None:
        if policy not in REPLICA_POLICIES:
            raise ValueError(f"replica policy must be one of {REPLICA_POLICIES}")
        self.policy = policy
        self.load_weight = load_weight
        self._turn = itertools.count()
        self.events: dict[str, CachedPrefixes] = {}
        self.sent: dict[str, SentPrefixes] = {}

    def cached_tokens(self, worker: Worker, prompt: PromptBlocks) -> tuple[int, str]:
        """(leading prompt tokens the worker holds, "events" | "affinity")."""
        events = self.events.get(worker.url)
        if events is not None and events.trusted and events.block_size:
            size = events.block_size
            return events.longest_prefix_blocks(prompt.hashes(size)) * size, "events"
        sent = self.sent.get(worker.url)
        blocks = sent.longest_prefix_blocks(prompt.hashes(AFFINITY_BLOCK_SIZE)) if sent else 0
        return blocks * AFFINITY_BLOCK_SIZE, "affinity"

    def order(self, workers: list[Worker], prompt: PromptBlocks | None,
              num_prompt_tokens: int) -> list[Worker]:
        if not workers:
            return []
        if self.policy == "round-robin":
            start = next(self._turn) % len(workers)
            ring = workers[start:] + workers[:start]
            return sorted(ring, key=lambda w: not w.healthy)  # stable: the ring order stays
        if self.policy == "least-loaded" or prompt is None:
            return sorted(workers, key=lambda w: (not w.healthy, w.outstanding_tokens,
                                                  w.outstanding_requests))
        return sorted(workers, key=lambda w: (not w.healthy, self.cost(w, prompt)))

    def cost(self, worker: Worker, prompt: PromptBlocks) -> float:
        hit = self.cached_tokens(worker, prompt)[0]
        miss = max(0, len(prompt) - hit)
        if worker.kv_use >= KV_NEARLY_FULL:
            miss = len(prompt)
        return (miss * (1 + worker.outstanding_requests)
                + self.load_weight * worker.outstanding_tokens)

    def sent_to(self, worker: Worker, prompt: PromptBlocks | None) -> None:
        if self.policy == "cache-aware" and prompt is not None:
            self.sent.setdefault(worker.url, SentPrefixes()).add(
                prompt.hashes(AFFINITY_BLOCK_SIZE))
