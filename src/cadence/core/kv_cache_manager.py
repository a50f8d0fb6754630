"""Which KV blocks each request holds, and the prefix cache on top of the block pool.

A request's block list covers positions [0, num_computed_tokens + scheduled tokens), block i
holding positions [i * block_size, (i + 1) * block_size). A block enters the prefix cache only
once all its positions are computed (after the step that wrote them), so a cache hit never
points at KV that a forward pass has not written yet.

Sliding-window models (every attention layer sees only the last `sliding_window` positions, as
Mistral's do) give back the blocks that no later query can see: after each step, blocks whose
positions all lie before the window of the next position are freed (and stay in the prefix
cache as evictable blocks). Their entries in the request's block table then point at one of its
live blocks (a placeholder that keeps the table's position -> block mapping; attention masks
those positions and never writes them), so a long sequence holds window-sized KV.

A waiting request protects its longest cached prefix from eviction (`protect_prefix`, released
by `release_protection` when it leaves the queue): the hashes of those blocks are counted in the
pool, which then evicts other cached blocks first. While it waits, its protection grows when the
next block of its prefix gets cached (another request computed it): each protecting request is
indexed under the one hash that would extend it, so a newly cached block costs one dict lookup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cadence.core.block_hash import BlockHash, extend_block_hashes
from cadence.core.block_pool import BlockPool, BlockPoolError
from cadence.core.request import Request


# Entry of a request's block list whose block fell out of the sliding window and was freed.
_DROPPED = -1


class KVCacheManager:
    """Allocates blocks for requests' new tokens and serves full-block prefix-cache hits."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        self.block_size = block_size
        # Positions a query sees, itself included (None: the whole sequence).
        self.sliding_window = sliding_window
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._req_blocks: dict[str, list[int]] = {}
        # Leading entries of each request's block list that were given back because they fell
        # out of the sliding window (_DROPPED in the list).
        self._num_dropped: dict[str, int] = {}
        # Blocks of finished requests kept for another engine to read (disaggregated prefill),
        # by request id, until release_lease.
        self._leased: dict[str, list[int]] = {}
        # How many leading blocks of each request are registered in (or came from) the cache.
        self._num_cached_blocks: dict[str, int] = {}
        # Waiting requests' protected prefixes: req_id -> (the request, how many leading block
        # hashes of it the pool counts as protected), and the hash that would extend each one
        # (its next block) -> the ids of requests waiting for it to be cached.
        self._protecting: dict[str, tuple[Request, int]] = {}
        self._extends: dict[BlockHash, dict[str, None]] = {}
        # Counted in tokens, as vLLM does: queries = prompt tokens looked up, hits = tokens found.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_live_blocks(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks a sequence of `num_tokens` ever holds at once when its steps add at
        most `max_chunk` tokens: all of them, or with a sliding window the window before a
        chunk plus the chunk (and a block of misalignment)."""
        full = self.blocks_for_tokens(num_tokens)
        if self.sliding_window is None:
            return full
        return min(full, self.blocks_for_tokens(self.sliding_window - 1 + max(1, max_chunk)) + 1)

    # -- prefix cache lookup ----------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> list[int]:
        """Blocks of the longest cached full-block prefix of `request` (nothing is taken yet).

        Never the whole sequence: at least its last token must be computed so that the step
        produces logits to sample from. Only for a request with nothing computed, and none for
        one whose every prompt position needs logits (Request.takes_prefix_hits).
        """
        if not self.enable_prefix_caching or request.num_computed_tokens > 0 or \
                not request.takes_prefix_hits:
            return []
        extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                            request.cache_salt)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block_id = self.pool.get_cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    # -- protection of waiting requests' prefixes -------------------------------------------
    def protect_prefix(self, request: Request, front: bool = False) -> int:
        """Protect the longest cached prefix of a request that joins the waiting queue (and keep
        protecting the blocks that extend it as they get cached). Only for a request that will
        look its prefix up at admission (as get_computed_blocks); a second call for the same
        request changes nothing. `front`: it joins the queue's front (preempted), so its blocks
        are the last protected ones evicted. Returns how many blocks it protects now."""
        if (not self.enable_prefix_caching or request.num_computed_tokens > 0
                or not request.takes_prefix_hits or request.req_id in self._protecting):
            return 0
        self._protecting[request.req_id] = (request, 0)
        return self._extend_protection(request, front)

    def release_protection(self, request: Request) -> None:
        """The request left the waiting queue (admitted: its hits are held by ref counts from
        now on; aborted, failed or finished): its protection of its prefix ends."""
        entry = self._protecting.pop(request.req_id, None)
        if entry is None:
            return
        num_protected = entry[1]
        self.pool.unprotect(request.block_hashes[:num_protected])
        if num_protected < (request.num_tokens - 1) // self.block_size:
            # Indexed under the hash that would extend it (see _extend_protection).
            waiters = self._extends[request.block_hashes[num_protected]]
            del waiters[request.req_id]
            if not waiters:
                del self._extends[request.block_hashes[num_protected]]

    def protecting_ids(self) -> set[str]:
        """Ids of the requests whose prefixes are protected now."""
        return set(self._protecting)

    def num_protected_blocks(self, req_id: str) -> int:
        """How many leading blocks of a waiting request's prefix it protects (0 if none)."""
        entry = self._protecting.get(req_id)
        return 0 if entry is None else entry[1]

    def _extend_protection(self, request: Request, front: bool = False) -> int:
        """Protect the request's prefix from where its protection ends up to the first block
        not cached (hashing its blocks only that far), and index it under that block's hash."""
        _, num_protected = self._protecting[request.req_id]
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        start = num_protected
        while num_protected < max_hit_blocks:
            if len(hashes) <= num_protected:
                extend_block_hashes(hashes, request.all_token_ids, self.block_size,
                                    request.cache_salt, max_blocks=num_protected + 1)
            if self.pool.get_cached_block(hashes[num_protected]) is None:
                self._extends.setdefault(hashes[num_protected], {})[request.req_id] = None
                break
            num_protected += 1
        self.pool.protect(hashes[start:num_protected], evict_last=front)
        self._protecting[request.req_id] = (request, num_protected)
        return num_protected

    def _newly_cached(self, block_hash: BlockHash) -> None:
        """A block was registered in the cache: waiting requests whose protected prefix it
        continues protect it (and whatever cached blocks follow it)."""
        waiters = self._extends.pop(block_hash, None)
        if waiters is None:
            return
        for req_id in waiters:
            self._extend_protection(self._protecting[req_id][0])

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admission's lookup (called once per admission, not per attempt)."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    # -- allocation -------------------------------------------------------------------------
    def num_blocks_required(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> int:
        """Total blocks the request would hold after this allocation."""
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        return self.blocks_for_tokens(num_computed + num_new_tokens)

    def holds_enough(self, request: Request, num_new_tokens: int) -> bool:
        """Whether the blocks the request holds already cover `num_new_tokens` more tokens (the
        common decode step: 15 of 16 need no new block), so there is nothing to allocate."""
        held = self._req_blocks.get(request.req_id)
        return held is not None and (
            len(held) * self.block_size >= request.num_computed_tokens + num_new_tokens)

    def num_free_blocks_needed(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> int:
        """Free blocks this allocation would consume: new blocks plus cache hits that are free
        right now (taking them removes them from the free queue)."""
        held = len(self._req_blocks.get(request.req_id, ()))
        required = self.num_blocks_required(request, num_new_tokens, computed_blocks)
        new_blocks = max(0, required - held - len(computed_blocks))
        revived = sum(1 for b in computed_blocks if self.pool.is_free(b))
        return new_blocks + revived

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> bool:
        need = self.num_free_blocks_needed(request, num_new_tokens, computed_blocks)
        return need <= self.pool.num_free_blocks

    def allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> list[int]:
        """Take the cache hits `computed_blocks` (admission only) and enough new blocks for
        `num_new_tokens` more tokens; returns the new block ids. The caller then advances
        `request.num_computed_tokens` by len(computed_blocks) * block_size.
        Raises BlockPoolError when it does not fit (check `can_allocate` first)."""
        if not self.can_allocate(request, num_new_tokens, computed_blocks):
            raise BlockPoolError(
                f"request {request.req_id}: not enough free blocks for {num_new_tokens} tokens"
            )
        blocks = self._req_blocks.setdefault(request.req_id, [])
        self._num_cached_blocks.setdefault(request.req_id, 0)
        if computed_blocks:
            if blocks:
                raise BlockPoolError(f"request {request.req_id}: cache hits after allocation")
            self.pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
            self._num_cached_blocks[request.req_id] = len(computed_blocks)
        required = self.num_blocks_required(request, num_new_tokens, computed_blocks)
        new_blocks = self.pool.allocate(max(0, required - len(blocks)))
        blocks.extend(new_blocks)
        return new_blocks

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's newly completed full blocks in the prefix cache (call after
        `num_computed_tokens` advanced past them, i.e. after the step computed them)."""
        if not self.enable_prefix_caching:
            return
        blocks = self._req_blocks.get(request.req_id)
        if not blocks:
            return
        start = self._num_cached_blocks[request.req_id]
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        if num_full <= start:
            return
        extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                            request.cache_salt)
        for i in range(start, num_full):
            if self.pool.cache_block(blocks[i], request.block_hashes[i]) and self._extends:
                self._newly_cached(request.block_hashes[i])
        self._num_cached_blocks[request.req_id] = num_full

    def release_out_of_window(self, request: Request) -> int:
        """Free the request's leading blocks that no later query can see (sliding window;
        call after `num_computed_tokens` advanced, after cache_computed_blocks). The next
        query, at position num_computed_tokens, sees positions >= it - window + 1. Returns how
        many blocks were freed now."""
        blocks = self._req_blocks.get(request.req_id)
        if self.sliding_window is None or not blocks:
            return 0
        first_seen = request.num_computed_tokens - self.sliding_window + 1
        end = min(max(0, first_seen) // self.block_size, len(blocks) - 1)
        if self.enable_prefix_caching:
            # Only blocks already registered in the cache (their hashes stay findable).
            end = min(end, self._num_cached_blocks.get(request.req_id, 0))
        start = self._num_dropped.get(request.req_id, 0)
        if end <= start:
            return 0
        freed = blocks[start:end]
        blocks[start:end] = [_DROPPED] * (end - start)
        self._num_dropped[request.req_id] = end
        # Oldest first: they are the least likely to be reused.
        self.pool.free(freed)
        return len(freed)

    def num_dropped_blocks(self, req_id: str) -> int:
        return self._num_dropped.get(req_id, 0)

    def free(self, request: Request) -> None:
        """Release every block the request holds (tail first, so its tail is evicted first)."""
        blocks = self._req_blocks.pop(request.req_id, None)
        self._num_cached_blocks.pop(request.req_id, None)
        self._num_dropped.pop(request.req_id, None)
        if blocks:
            self.pool.free(reversed([b for b in blocks if b != _DROPPED]))

    def lease(self, request: Request) -> tuple[int, ...]:
        """Keep the finished request's blocks (ref counts held) under its id; returns its block
        table (window-dropped entries as placeholders, see get_block_table)."""
        table = self.get_block_table(request.req_id)
        blocks = [b for b in self._req_blocks.pop(request.req_id, []) if b != _DROPPED]
        self._num_cached_blocks.pop(request.req_id, None)
        self._num_dropped.pop(request.req_id, None)
        if request.req_id in self._leased:
            raise BlockPoolError(f"request {request.req_id} already holds a lease")
        self._leased[request.req_id] = blocks
        return table

    def release_lease(self, req_id: str) -> bool:
        """Free a lease's blocks (tail first). False when there is no such lease."""
        blocks = self._leased.pop(req_id, None)
        if blocks is None:
            return False
        self.pool.free(reversed(blocks))
        return True

    def leased_blocks(self, req_id: str) -> tuple[int, ...] | None:
        blocks = self._leased.get(req_id)
        return None if blocks is None else tuple(blocks)

    @property
    def num_leases(self) -> int:
        return len(self._leased)

    @property
    def num_leased_blocks(self) -> int:
        return sum(len(b) for b in self._leased.values())

    def get_block_table(self, req_id: str) -> tuple[int, ...]:
        """Block ids by position / block_size. Entries that fell out of the sliding window
        hold the first live block: a valid index whose positions attention masks."""
        blocks = self._req_blocks.get(req_id, ())
        dropped = self._num_dropped.get(req_id, 0)
        if not dropped:
            return tuple(blocks)
        return (blocks[dropped],) * dropped + tuple(blocks[dropped:])

    def holds_blocks(self, req_id: str) -> bool:
        return bool(self._req_blocks.get(req_id))

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix not in use; returns the number of blocks dropped. Waiting
        requests keep counting their protected hashes (a block computed again with one of them
        is protected again), so the pool's counts stay theirs."""
        return self.pool.reset_prefix_cache()

    # -- integrity --------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Pool integrity, plus: each block's ref count equals the number of requests (and
        leases) holding it, no request holds a block twice, and the pool's protection counts
        are exactly the waiting requests' protected prefixes, each indexed under its next hash."""
        self.pool.check_integrity()
        protected: Counter[BlockHash] = Counter()
        indexed: Counter[str] = Counter()
        for block_hash, waiters in self._extends.items():
            if not waiters or self.pool.get_cached_block(block_hash) is not None:
                raise BlockPoolError(f"waiters indexed under hash {block_hash.hex()}: "
                                     f"{len(waiters)}, cached: it should be neither")
            for req_id in waiters:
                request, num_protected = self._protecting[req_id]
                if request.block_hashes[num_protected] != block_hash:
                    raise BlockPoolError(f"request {req_id} indexed under a hash not its next")
                indexed[req_id] += 1
        for req_id, (request, num_protected) in self._protecting.items():
            protected.update(request.block_hashes[:num_protected])
            max_hit_blocks = (request.num_tokens - 1) // self.block_size
            if indexed[req_id] != (num_protected < max_hit_blocks):
                raise BlockPoolError(f"request {req_id}: protected {num_protected} of "
                                     f"{max_hit_blocks} blocks, indexed {indexed[req_id]} times")
        if dict(protected) != self.pool.protect_counts():
            raise BlockPoolError("pool protection counts differ from the waiting requests' "
                                 "protected prefixes")
        holders: Counter[int] = Counter()
        for req_id, blocks in [*self._req_blocks.items(), *self._leased.items()]:
            blocks = [b for b in blocks if b != _DROPPED]
            if len(set(blocks)) != len(blocks):
                raise BlockPoolError(f"request {req_id} holds a block twice: {blocks}")
            holders.update(blocks)
        for block in self.pool.blocks:
            if block.ref_count != holders[block.block_id]:
                raise BlockPoolError(
                    f"block {block.block_id}: ref_count {block.ref_count} but "
                    f"{holders[block.block_id]} requests hold it"
                )
