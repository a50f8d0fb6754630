"""The physical KV blocks: reference counts, the free queue and the prefix-cache hash map.

A block is *used* while some request holds it (ref_count > 0) and *free* otherwise. A free block
that still holds a full, hashed prefix block stays *cached*: a later request with the same prefix
can take it back (`touch`) without recomputing. Allocation takes plain free blocks first and only
then evicts cached ones, least recently freed first, so the cache keeps what it can.

Waiting requests protect their cached prefixes (`protect` / `unprotect`, counted per block hash:
several waiting requests may share a system prompt): a free cached block whose hash some
waiting request protects is evicted only when no unprotected cached block is left, so a
request queued behind a full pool still finds the prefix it was routed for when it is admitted.
Protection never makes an allocation fail: protected blocks stay free and evictable. Among
protected blocks the most recently protected go first (the newest arrival's prefix, tail
first: it is admitted last), those of a request put back at the queue's front (preempted) last.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cadence.core.block_hash import BlockHash


class BlockPoolError(RuntimeError):
    """The pool was asked for something impossible, or its bookkeeping is inconsistent."""


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    # Hash of the full prefix block this block holds, if it is registered in the prefix cache.
    block_hash: BlockHash | None = None


class BlockPool:
    """`num_blocks` KV blocks with ref counts, an LRU free queue and a hash -> block map."""

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks without a cached hash, reused first. Insertion-ordered set.
        self._free_plain: dict[int, None] = dict.fromkeys(range(num_blocks))
        # Free blocks holding a cached prefix block no waiting request protects, oldest first
        # (the eviction order), and those some waiting request protects (evicted only after
        # every unprotected one, from the newest end: see `protect`).
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._free_protected: OrderedDict[int, None] = OrderedDict()
        # Block hash -> how many waiting requests protect it (> 0). Kept by hash, not block:
        # a protected block evicted as a last resort and computed again later is protected
        # again, and releasing never has to find which block held the hash.
        self._protect_count: dict[BlockHash, int] = {}
        self._cached: dict[BlockHash, int] = {}
        self.num_evictions = 0
        # Evictions of protected blocks (nothing unprotected was left to evict).
        self.num_protected_evictions = 0
        # When a list: each prefix-cache change as (True, hash) cached / (False, hash) evicted,
        # for whoever tells others what this cache holds (a replica's KV events); None: off.
        self.cache_events: list[tuple[bool, BlockHash]] | None = None
        # Told (block id, hash) when allocation evicts a cached block, before its new owner
        # overwrites it: the scheduler may spill it to the disk tier (core/disk_tier.py).
        self.on_evict: Callable[[int, BlockHash], None] | None = None

    # -- counts -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached ones included: they can be evicted)."""
        return len(self._free_plain) + len(self._free_cached) + len(self._free_protected)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix block (evictable), protected or not."""
        return len(self._free_cached) + len(self._free_protected)

    @property
    def num_protected_free_blocks(self) -> int:
        """Free cached blocks that a waiting request's prefix protects (evicted last)."""
        return len(self._free_protected)

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks (ref_count 1 each), evicting cached ones only when needed."""
        if n > self.num_free_blocks:
            raise BlockPoolError(f"asked for {n} blocks, only {self.num_free_blocks} free")
        out: list[int] = []
        for _ in range(n):
            if self._free_plain:
                block_id = next(iter(self._free_plain))
                del self._free_plain[block_id]
            else:
                if self._free_cached:
                    block_id, _ = self._free_cached.popitem(last=False)
                else:
                    # Only protected blocks are left: a waiting request loses part of its
                    # prefix rather than this allocation failing; the one admitted last.
                    block_id, _ = self._free_protected.popitem(last=True)
                    self.num_protected_evictions += 1
                block_hash = self.blocks[block_id].block_hash
                self._evict(block_id)
                if self.on_evict is not None:
                    self.on_evict(block_id, block_hash)
            self.blocks[block_id].ref_count = 1
            out.append(block_id)
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take another reference on blocks (prefix-cache hits); revives free cached blocks."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                if block_id in self._free_cached:
                    del self._free_cached[block_id]
                elif block_id in self._free_protected:
                    del self._free_protected[block_id]
                else:
                    raise BlockPoolError(f"touch of free block {block_id} that is not cached")
            block.ref_count += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference on each block, in the order given: a block reaching zero joins the
        free queue's most-recent end, so pass a request's blocks tail first to have its tail
        evicted before its (more shareable) head."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise BlockPoolError(f"double free of block {block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash in self._protect_count:
                    # Wanted by a waiting request while others held it (a shared prompt):
                    # among the protected blocks, evicted last.
                    self._free_protected[block_id] = None
                    self._free_protected.move_to_end(block_id, last=False)
                elif block.block_hash is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_plain[block_id] = None

    # -- prefix cache -----------------------------------------------------------------------
    def cached_hashes(self) -> list[BlockHash]:
        """Every prefix block hash this pool holds now (a snapshot of the prefix cache)."""
        return list(self._cached)

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        return self._cached.get(block_hash)

    def cache_block(self, block_id: int, block_hash: BlockHash) -> bool:
        """Register a used block as holding the full prefix block `block_hash`.

        Returns False (and changes nothing) when the block is already registered or another
        block holds the same prefix (two requests computed it at once): one copy is enough.
        """
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise BlockPoolError(f"cache_block on free block {block_id}")
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        self._cached[block_hash] = block_id
        if self.cache_events is not None:
            self.cache_events.append((True, block_hash))
        return True

    def protect(self, block_hashes: Iterable[BlockHash], evict_last: bool = False) -> None:
        """One more waiting request protects these hashes (a prefix, head first): their free
        cached blocks (now, or when freed later) are evicted only after every unprotected one.
        Among protected blocks, those protected last are evicted first, the prefix's tail before
        its head (a request that joins the queue's end is admitted last); `evict_last` puts
        them behind every other protected block instead (a request put back at the front)."""
        newly: list[int] = []
        for block_hash in block_hashes:
            count = self._protect_count.get(block_hash, 0)
            self._protect_count[block_hash] = count + 1
            if count == 0:
                block_id = self._cached.get(block_hash)
                if block_id is not None and block_id in self._free_cached:
                    del self._free_cached[block_id]
                    self._free_protected[block_id] = None
                    newly.append(block_id)
        if evict_last:
            for block_id in reversed(newly):  # the head ends up the very last to go
                self._free_protected.move_to_end(block_id, last=False)

    def unprotect(self, block_hashes: Iterable[BlockHash]) -> None:
        """Undo one `protect` of these hashes. A block nobody protects any more goes back to
        the unprotected queue's most recent end: a request wanted it a moment ago."""
        for block_hash in block_hashes:
            count = self._protect_count.get(block_hash, 0)
            if count <= 0:
                raise BlockPoolError(f"unprotect of a hash nobody protects: {block_hash.hex()}")
            if count > 1:
                self._protect_count[block_hash] = count - 1
                continue
            del self._protect_count[block_hash]
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._free_protected:
                del self._free_protected[block_id]
                self._free_cached[block_id] = None

    def protect_counts(self) -> dict[BlockHash, int]:
        """Block hash -> how many waiting requests protect it (a copy, for integrity checks)."""
        return dict(self._protect_count)

    def is_free(self, block_id: int) -> bool:
        return self.blocks[block_id].ref_count == 0

    def reset_prefix_cache(self) -> int:
        """Drop every cached hash of free blocks; returns how many were dropped."""
        dropped = 0
        for queue in (self._free_cached, self._free_protected):
            while queue:
                block_id, _ = queue.popitem(last=False)
                self._evict(block_id)
                self._free_plain[block_id] = None
                dropped += 1
        return dropped

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.block_hash is not None
        del self._cached[block.block_hash]
        if self.cache_events is not None:
            self.cache_events.append((False, block.block_hash))
        block.block_hash = None
        self.num_evictions += 1

    # -- integrity --------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise BlockPoolError unless: free + used == total, ref counts >= 0, every free block
        is in exactly one free queue (cached iff it has a hash; protected iff its hash is),
        protection counts are positive, and the hash map matches the blocks' hashes both ways."""
        used = 0
        for block in self.blocks:
            bid = block.block_id
            if block.ref_count < 0:
                raise BlockPoolError(f"block {bid} has ref_count {block.ref_count}")
            in_plain = bid in self._free_plain
            in_cached, in_protected = bid in self._free_cached, bid in self._free_protected
            if block.ref_count > 0:
                used += 1
                if in_plain or in_cached or in_protected:
                    raise BlockPoolError(f"used block {bid} is in a free queue")
            elif in_plain + in_cached + in_protected != 1:
                raise BlockPoolError(f"free block {bid} is in {in_plain + in_cached + in_protected}"
                                     " free queues, not one")
            elif in_plain != (block.block_hash is None):
                raise BlockPoolError(f"free block {bid}: queue does not match its cached hash")
            elif in_protected != (block.block_hash in self._protect_count):
                raise BlockPoolError(f"free block {bid}: queue does not match its protection")
            if block.block_hash is not None and self._cached.get(block.block_hash) != bid:
                raise BlockPoolError(f"block {bid} has a hash the cache map does not point to it")
        if used + self.num_free_blocks != self.num_blocks:
            raise BlockPoolError(
                f"free ({self.num_free_blocks}) + used ({used}) != total ({self.num_blocks})"
            )
        for block_hash, bid in self._cached.items():
            if self.blocks[bid].block_hash != block_hash:
                raise BlockPoolError(f"cache map points to block {bid} whose hash differs")
        for block_hash, count in self._protect_count.items():
            if count <= 0:
                raise BlockPoolError(f"hash {block_hash.hex()} protected {count} times")
