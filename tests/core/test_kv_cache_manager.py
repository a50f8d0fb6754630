from __future__ import annotations

import pytest
from core_driver import make_request

from cadence.core.block_pool import BlockPoolError
from cadence.core.kv_cache_manager import KVCacheManager


def admit(kv: KVCacheManager, req, num_new: int) -> None:
    """What the scheduler does on admission: take hits, then blocks for the chunk."""
    hits = kv.get_computed_blocks(req)
    kv.allocate(req, num_new, hits)
    req.num_computed_tokens = len(hits) * kv.block_size


def test_allocation_covers_new_tokens_block_by_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", range(10))
    assert kv.num_free_blocks_needed(req, 10) == 3
    assert kv.can_allocate(req, 10)
    assert len(kv.allocate(req, 10)) == 3
    req.num_computed_tokens = 10
    assert kv.num_free_blocks_needed(req, 2) == 0  # positions 10, 11 fit the third block
    assert kv.allocate(req, 2) == []
    assert kv.num_free_blocks_needed(req, 3) == 1
    kv.check_integrity()


def test_holds_enough_agrees_with_the_blocks_an_allocation_would_take():
    # The scheduler's fast path skips allocate() when holds_enough: it must say yes exactly
    # when allocate would take no new block.
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", range(10))
    assert not kv.holds_enough(req, 1)  # holds nothing yet
    kv.allocate(req, 10)
    req.num_computed_tokens = 10
    for num_new in range(1, 6):
        assert kv.holds_enough(req, num_new) == (kv.num_free_blocks_needed(req, num_new) == 0)
    assert kv.holds_enough(req, 2) and not kv.holds_enough(req, 3)


def test_allocation_that_does_not_fit_is_refused():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    req = make_request("a", range(9))
    assert not kv.can_allocate(req, 9)
    with pytest.raises(BlockPoolError):
        kv.allocate(req, 9)
    kv.check_integrity()


def test_prefix_hit_skips_full_computed_blocks_only():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", range(10))
    admit(kv, first, 10)
    assert kv.get_computed_blocks(make_request("b", range(10))) == []  # not computed yet
    first.num_computed_tokens = 10
    kv.cache_computed_blocks(first)
    second = make_request("b", list(range(9)) + [99])
    hits = kv.get_computed_blocks(second)
    assert hits == list(kv.get_block_table("a")[:2])  # two full blocks; block 3 is partial
    kv.allocate(second, 2, hits)
    assert kv.pool.blocks[hits[0]].ref_count == 2
    kv.check_integrity()


def test_lookup_never_returns_the_whole_prompt():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", range(8))
    admit(kv, first, 8)
    first.num_computed_tokens = 8
    kv.cache_computed_blocks(first)
    # Same 8 tokens (2 full blocks): only the first block may come from the cache, so the
    # last token is computed and has logits.
    hits = kv.get_computed_blocks(make_request("b", range(8)))
    assert len(hits) == 1


def test_freed_request_leaves_its_blocks_cached():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    req = make_request("a", range(5))
    admit(kv, req, 5)
    req.num_computed_tokens = 5
    kv.cache_computed_blocks(req)
    kv.free(req)
    assert kv.pool.num_free_blocks == 4 and kv.pool.num_cached_free_blocks == 2
    again = make_request("b", range(5))
    hits = kv.get_computed_blocks(again)
    assert len(hits) == 2
    # Reviving two free cached blocks consumes them from the free pool, plus one new block.
    assert kv.num_free_blocks_needed(again, 1, hits) == 3
    kv.check_integrity()


def test_prefix_caching_off_never_hits_or_counts():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    req = make_request("a", range(6))
    admit(kv, req, 6)
    req.num_computed_tokens = 6
    kv.cache_computed_blocks(req)
    kv.record_prefix_lookup(6, 0)
    assert kv.get_computed_blocks(make_request("b", range(6))) == []
    assert kv.prefix_cache_queries == 0 and kv.pool.num_cached_free_blocks == 0


def test_integrity_sees_a_leaked_reference():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    req = make_request("a", range(3))
    admit(kv, req, 3)
    kv.pool.blocks[kv.get_block_table("a")[0]].ref_count += 1
    with pytest.raises(BlockPoolError, match="requests hold it"):
        kv.check_integrity()


def _salted(req_id: str, prompt, salt: str | None):
    req = make_request(req_id, prompt)
    req.cache_salt = salt
    return req


def test_cache_salt_shares_blocks_only_within_one_salt():
    """vLLM's cache_salt: requests with different salts (or a salt and none) never hit each
    other's blocks, not even the first; the same salt, or none on both, does."""
    kv = KVCacheManager(num_blocks=32, block_size=4)
    prompt = list(range(13))  # 3 full blocks
    for salt in ("tenant-a", None):
        owner = _salted(f"owner-{salt}", prompt, salt)
        admit(kv, owner, len(prompt))
        owner.num_computed_tokens = len(prompt)
        kv.cache_computed_blocks(owner)
    for salt, other, expected in (("tenant-a", "tenant-a", 3), ("tenant-a", "tenant-b", 0),
                                  ("tenant-a", None, 3), (None, None, 3)):
        del salt  # the owners above hold "tenant-a" and unsalted copies of the prompt
        probe = _salted("probe", prompt, other)
        assert len(kv.get_computed_blocks(probe)) == expected, other
    a_hits = kv.get_computed_blocks(_salted("p1", prompt, "tenant-a"))
    none_hits = kv.get_computed_blocks(_salted("p2", prompt, None))
    assert not set(a_hits) & set(none_hits)  # two copies: the salt kept them apart
    kv.check_integrity()


def test_cache_salt_must_be_a_non_empty_string():
    from cadence.core.request import Request
    from cadence.core.sampling_params import SamplingParams

    for bad in ("", 5):
        with pytest.raises(ValueError, match="cache_salt"):
            Request("r", [1, 2], SamplingParams(), 0.0, cache_salt=bad)
