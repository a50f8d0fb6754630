from __future__ import annotations

import pytest

from cadence.core.block_hash import ROOT_BLOCK_HASH, extend_block_hashes, hash_block_tokens
from cadence.core.block_pool import BlockPool, BlockPoolError


def test_allocate_and_free_keep_counts():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free_blocks == 1 and pool.num_used_blocks == 3
    pool.check_integrity()
    pool.free(a)
    assert pool.num_free_blocks == 4
    pool.check_integrity()


def test_over_allocation_and_double_free_are_errors():
    pool = BlockPool(2)
    with pytest.raises(BlockPoolError, match="only 2 free"):
        pool.allocate(3)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(BlockPoolError, match="double free"):
        pool.free([b])
    pool.check_integrity()


def test_freed_hashed_block_stays_cached_until_reused():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    assert pool.cache_block(b, b"h1")
    pool.free([b])
    assert pool.num_cached_free_blocks == 1 and pool.get_cached_block(b"h1") == b
    # Plain free blocks are used before the cached one is evicted.
    others = pool.allocate(2)
    assert b not in others and pool.get_cached_block(b"h1") == b
    pool.check_integrity()
    # A cache hit revives it without eviction.
    pool.touch([b])
    assert pool.blocks[b].ref_count == 1 and pool.num_free_blocks == 0
    pool.check_integrity()


def test_eviction_is_least_recently_freed_first():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        pool.cache_block(b, f"h{i}".encode())
    pool.free([blocks[2], blocks[0], blocks[1]])  # freed in this order
    (first,) = pool.allocate(1)
    assert first == blocks[2] and pool.get_cached_block(b"h2") is None
    assert pool.get_cached_block(b"h0") == blocks[0]
    (second,) = pool.allocate(1)
    assert second == blocks[0]
    assert pool.num_evictions == 2
    pool.check_integrity()


def test_shared_block_is_free_only_after_last_reference():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.cache_block(b, b"h")
    pool.touch([b])
    assert pool.blocks[b].ref_count == 2
    pool.free([b])
    assert not pool.is_free(b)
    pool.free([b])
    assert pool.is_free(b)
    pool.check_integrity()


def test_duplicate_hash_is_not_registered_twice():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    assert pool.cache_block(a, b"same")
    assert not pool.cache_block(b, b"same")
    assert pool.blocks[b].block_hash is None and pool.get_cached_block(b"same") == a
    pool.check_integrity()


def test_touching_a_plain_free_block_is_an_error():
    pool = BlockPool(1)
    with pytest.raises(BlockPoolError):
        pool.touch([0])


def test_integrity_check_catches_corruption():
    pool = BlockPool(3)
    a = pool.allocate(1)[0]
    pool.blocks[a].ref_count = -1
    with pytest.raises(BlockPoolError, match="ref_count"):
        pool.check_integrity()
    pool = BlockPool(3)
    a = pool.allocate(1)[0]
    pool.cache_block(a, b"h")
    pool._cached[b"other"] = a  # a map entry the block does not match
    with pytest.raises(BlockPoolError, match="hash"):
        pool.check_integrity()


def test_reset_prefix_cache_drops_only_free_cached_blocks():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache_block(a, b"a")
    pool.cache_block(b, b"b")
    pool.free([a])
    assert pool.reset_prefix_cache() == 1
    assert pool.get_cached_block(b"a") is None and pool.get_cached_block(b"b") == b
    pool.check_integrity()


def test_block_hashes_chain_the_whole_prefix():
    h0 = hash_block_tokens(ROOT_BLOCK_HASH, [1, 2])
    assert h0 == hash_block_tokens(ROOT_BLOCK_HASH, (1, 2))
    # Same block tokens behind a different prefix hash differently.
    assert hash_block_tokens(h0, [3, 4]) != hash_block_tokens(ROOT_BLOCK_HASH, [3, 4])
    hashes: list[bytes] = []
    extend_block_hashes(hashes, [1, 2, 3, 4, 5], block_size=2)
    assert hashes == [h0, hash_block_tokens(h0, [3, 4])]  # the partial block is not hashed
    extend_block_hashes(hashes, [1, 2, 3, 4, 5, 6], block_size=2)
    assert len(hashes) == 3
