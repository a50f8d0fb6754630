"""Which replica serves a request: `round-robin`, `least-loaded` or `cache-aware`.

cache-aware weighs, per worker, in prompt tokens (the time to prefill one is the unit):

    cost = miss * (1 + streams) + load_weight * work + kv_wait
           miss    = prompt tokens beyond the longest prefix the worker holds (what it must
                     prefill; the hit comes from its KV events, or, while those are not to
                     be trusted, from the prefixes this router sent there: session affinity)
           streams = requests this router has in flight there: each one stalls while the
                     miss is prefilled (the interference the request causes there)
           work    = the work this router has in flight there: the prompt tokens those
                     requests had to compute (their misses when routed) plus their outputs,
                     not their cached prefixes (a long conversation that hits costs little)
           kv_wait = work + miss when the tokens its in-flight requests hold (prompts and
                     outputs, cached or not) plus this request's exceed its KV pool
                     (scraped): the request would wait for others to finish, or preempt them

and takes the cheapest. `load_weight` trades cache hits against balance: 0 follows the cache
and the interference alone, large values make it least-loaded by work. (The first version
charged every prompt token in flight as load and ignored hits on a replica whose KV was >= 95%
used: with caches too small for the live conversations that spread each conversation over both
replicas and lost to least-loaded.)
Healthy workers always come before failed ones; the order returned is also the failover
order (a worker that cannot be reached is replaced by the next).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from cadence.core.block_hash import BlockHash, extend_block_hashes, leading_blocks_held
from cadence.disagg.kv_events import CachedPrefixes
from cadence.disagg.router.config import REPLICA_POLICIES
from cadence.disagg.router.request_truncation import truncated
from cadence.disagg.router.workers import Worker

# Session affinity records this many block hashes per worker (least recently sent dropped),
# of blocks of AFFINITY_BLOCK_SIZE tokens: its own size, so the record stays comparable
# whether or not (and before) the workers' block size is known from their events.
AFFINITY_BLOCKS = 200_000
AFFINITY_BLOCK_SIZE = 16


class PromptBlocks:
    """A request's prompt token ids and their chained block hashes, per block size (computed
    once per size), salted with the request's cache_salt as the workers salt them."""

    def __init__(self, token_ids: Sequence[int], cache_salt: str | None = None) -> None:
        self.token_ids = token_ids
        self.cache_salt = cache_salt
        self._hashes: dict[int, list[BlockHash]] = {}

    @classmethod
    def of_request(cls, token_ids: Sequence[int], body: dict,
                   keep: int | None = None) -> PromptBlocks:
        """The blocks a worker runs for this request body: the prompt cut to the `keep`
        tokens its truncate_prompt_tokens leaves (request_truncation.kept_prompt_tokens),
        hashed with its cache_salt."""
        token_ids = truncated(token_ids, body, keep)
        salt = body.get("cache_salt")
        return cls(token_ids, salt if isinstance(salt, str) and salt else None)

    def __len__(self) -> int:
        return len(self.token_ids)

    def hashes(self, block_size: int) -> list[BlockHash]:
        if block_size not in self._hashes:
            out: list[BlockHash] = []
            extend_block_hashes(out, self.token_ids, block_size, self.cache_salt)
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
        return leading_blocks_held(block_hashes, self.hashes.__contains__)


class ReplicaSelector:
    def __init__(self, policy: str, load_weight: float = 0.25) -> None:
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
              num_prompt_tokens: int, max_tokens: int = 16) -> list[Worker]:
        if not workers:
            return []
        if self.policy == "round-robin":
            start = next(self._turn) % len(workers)
            ring = workers[start:] + workers[:start]
            return sorted(ring, key=lambda w: not w.healthy)  # stable: the ring order stays
        if self.policy == "least-loaded" or prompt is None:
            return sorted(workers, key=lambda w: (not w.healthy, w.outstanding_tokens,
                                                  w.outstanding_requests))
        return sorted(workers, key=lambda w: (not w.healthy,
                                              self.cost(w, prompt, max_tokens)))

    def miss_tokens(self, worker: Worker, prompt: PromptBlocks) -> int:
        """Prompt tokens `worker` would compute (all but the longest prefix it holds)."""
        return max(0, len(prompt) - self.cached_tokens(worker, prompt)[0])

    def block_size(self, worker: Worker) -> int:
        events = self.events.get(worker.url)
        return events.block_size if events is not None and events.block_size else \
            AFFINITY_BLOCK_SIZE

    def cost(self, worker: Worker, prompt: PromptBlocks, max_tokens: int = 16) -> float:
        return sum(self.cost_terms(worker, prompt, max_tokens).values())

    def cost_terms(self, worker: Worker, prompt: PromptBlocks,
                   max_tokens: int = 16) -> dict[str, float]:
        """The cost's three terms (module docstring): "interference" (miss x (1 + streams)),
        "load" (load_weight x work), "kv_wait"."""
        miss = self.miss_tokens(worker, prompt)
        capacity = worker.kv_capacity_blocks * self.block_size(worker)
        full = capacity and worker.outstanding_tokens + len(prompt) + max_tokens > capacity
        return {"interference": float(miss * (1 + worker.outstanding_requests)),
                "load": self.load_weight * worker.outstanding_work,
                "kv_wait": float(worker.outstanding_work + miss) if full else 0.0}

    def sent_to(self, worker: Worker, prompt: PromptBlocks | None) -> None:
        if self.policy == "cache-aware" and prompt is not None:
            self.sent.setdefault(worker.url, SentPrefixes()).add(
                prompt.hashes(AFFINITY_BLOCK_SIZE))
