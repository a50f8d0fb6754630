"""Waiting requests protect their cached prefixes from eviction (core/protected_queue.py): the
pool evicts unprotected cached blocks first, protected ones only when nothing else is left, and
the protection counts follow the waiting queue exactly."""

from __future__ import annotations

import pytest
from core_driver import make_request, make_scheduler

from cadence.core.block_hash import extend_block_hashes
from cadence.core.block_pool import BlockPool, BlockPoolError
from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.plan import StepOutput
from cadence.executor.fake_executor import FakeExecutor

BLOCK = 4


def cached_pool(num_blocks: int, num_cached: int) -> tuple[BlockPool, list[bytes]]:
    """A pool whose first `num_cached` blocks were used, hashed and freed in id order (block 0
    the least recently freed), the rest plain free."""
    pool = BlockPool(num_blocks)
    blocks = pool.allocate(num_cached)
    hashes = [bytes([i]) * 16 for i in range(num_cached)]
    for block_id, block_hash in zip(blocks, hashes):
        pool.cache_block(block_id, block_hash)
    for block_id in blocks:
        pool.free([block_id])
    return pool, hashes


def test_eviction_takes_unprotected_cached_blocks_first():
    pool, hashes = cached_pool(num_blocks=6, num_cached=4)
    pool.protect(hashes[:2])  # the two least recently freed: LRU alone would evict them first
    taken = pool.allocate(4)  # 2 plain, then 2 cached
    assert sorted(taken[2:]) == [2, 3]
    assert pool.get_cached_block(hashes[0]) == 0 and pool.get_cached_block(hashes[1]) == 1
    assert pool.num_protected_evictions == 0
    pool.check_integrity()


def test_protected_blocks_are_evicted_when_nothing_else_is_free():
    pool, hashes = cached_pool(num_blocks=4, num_cached=4)
    pool.protect(hashes)
    assert pool.num_free_blocks == 4  # protection takes nothing out of the free count
    assert sorted(pool.allocate(4)) == [0, 1, 2, 3]  # no allocation fails that did not before
    assert pool.num_protected_evictions == 4
    assert all(pool.get_cached_block(h) is None for h in hashes)
    # The counts are by hash and stay until released, evicted or not.
    assert pool.protect_counts() == dict.fromkeys(hashes, 1)
    pool.unprotect(hashes)
    assert pool.protect_counts() == {}
    pool.check_integrity()


def test_protection_covers_blocks_freed_later_and_ends_at_the_newest_end():
    pool, hashes = cached_pool(num_blocks=3, num_cached=2)
    held = pool.allocate(1)[0]
    pool.cache_block(held, b"h" * 16)
    pool.protect([b"h" * 16])  # protected while a request still holds it
    pool.free([held])
    assert pool.num_protected_free_blocks == 1
    pool.check_integrity()
    pool.protect(hashes[:1])
    pool.unprotect(hashes[:1])  # block 0 is now the most recently released: block 1 goes first
    assert pool.allocate(1) == [1]
    with pytest.raises(BlockPoolError):
        pool.unprotect(hashes[:1])  # nobody protects it any more


def test_among_protected_blocks_the_last_request_in_line_loses_first():
    # FCFS admits the queue's head first: a fallback eviction takes the newest arrival's
    # prefix, tail first, and a request put back at the front (preempted) loses last.
    pool, hashes = cached_pool(num_blocks=6, num_cached=6)
    pool.protect(hashes[0:2])  # waiting since long ago: admitted next
    pool.protect(hashes[2:4])  # arrived later
    pool.protect(hashes[4:6], evict_last=True)  # preempted: back at the front of the queue
    assert pool.allocate(6) == [3, 2, 1, 0, 5, 4]  # each prefix tail first
    assert pool.num_protected_evictions == 6
    pool.check_integrity()


def finished_prefix(kv: KVCacheManager, req_id: str, tokens: list[int]):
    """A request that computed `tokens` and finished: its full blocks stay cached, free."""
    req = make_request(req_id, tokens)
    kv.allocate(req, len(tokens))
    req.num_computed_tokens = len(tokens)
    kv.cache_computed_blocks(req)
    kv.free(req)
    return req


def test_a_prefix_shared_by_two_waiting_requests_is_counted_twice():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK)
    system = list(range(100, 108))  # two full blocks
    finished_prefix(kv, "old", system + [1, 2, 3, 4])
    first = make_request("first", system + [1, 2, 3, 4, 9])
    second = make_request("second", system + [10, 11])
    assert kv.protect_prefix(first) == 3  # the system prompt and "old"'s third block
    assert kv.protect_prefix(second) == 2
    assert kv.protect_prefix(second) == 0  # once per request
    counts = kv.pool.protect_counts()
    assert sorted(counts.values()) == [1, 2, 2]
    kv.check_integrity()
    kv.release_protection(first)
    assert sorted(kv.pool.protect_counts().values()) == [1, 1]
    assert kv.pool.num_protected_free_blocks == 2  # the system prompt: second still waits
    kv.release_protection(second)
    assert kv.pool.protect_counts() == {} and kv.pool.num_protected_free_blocks == 0
    kv.check_integrity()


def test_protection_grows_as_the_waiting_prefix_gets_cached():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK)
    prompt = list(range(100, 112))  # three full blocks
    running = make_request("running", prompt + [1])
    kv.allocate(running, len(prompt))
    waiting = make_request("waiting", prompt + [2])
    assert kv.protect_prefix(waiting) == 0  # nothing of it is cached yet
    assert len(waiting.block_hashes) == 1  # hashed only as far as it looked
    running.num_computed_tokens = 8  # its first two blocks computed and cached
    kv.cache_computed_blocks(running)
    assert kv.num_protected_blocks("waiting") == 2
    kv.check_integrity()
    running.num_computed_tokens = 12
    kv.cache_computed_blocks(running)
    assert kv.num_protected_blocks("waiting") == 3  # its whole hit-able prefix
    kv.free(running)
    assert kv.pool.num_protected_free_blocks == 3
    kv.check_integrity()
    kv.release_protection(waiting)
    assert kv.pool.protect_counts() == {}
    kv.check_integrity()


def test_integrity_catches_counts_that_do_not_match_the_waiting_requests():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK)
    finished_prefix(kv, "old", list(range(8)))
    req = make_request("w", list(range(9)))
    kv.protect_prefix(req)
    kv.check_integrity()
    kv.pool.protect(req.block_hashes[:1])  # a count no waiting request stands for
    with pytest.raises(BlockPoolError, match="protection counts"):
        kv.check_integrity()
    kv.pool.unprotect(req.block_hashes[:1])
    kv.check_integrity()
    kv.pool._protect_count[req.block_hashes[0]] = 0  # a zero count left behind
    with pytest.raises(BlockPoolError):
        kv.pool.check_integrity()


def step(scheduler, executor) -> None:
    plan = scheduler.schedule()
    scheduler.update(plan, executor.execute(plan) if not plan.is_empty
                     else StepOutput(plan.step_id))
    scheduler.check_integrity()


def run_until_done(scheduler, executor, req_id: str, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        req = scheduler.get_request(req_id)
        if req is None:
            return
        step(scheduler, executor)
    raise AssertionError(f"{req_id} did not finish")


def test_a_queued_request_keeps_the_prefix_it_came_for():
    # One seat: a request waits while another runs and grows into the pool's cached blocks.
    # Its prefix was freed first, so LRU alone would evict it first; protected, the other
    # finished request's blocks go instead and it is admitted with its whole prefix.
    scheduler = make_scheduler(block_size=BLOCK, num_blocks=12, max_seqs=1, budget=64)
    executor = FakeExecutor(vocab_size=50)
    history = list(range(10, 26))  # four full blocks: a conversation's previous turn
    other = list(range(30, 46))
    for req_id, prompt in (("turn1", history), ("other", other)):
        scheduler.add_request(make_request(req_id, prompt, max_tokens=1))
        run_until_done(scheduler, executor, req_id)
    assert scheduler.kv.pool.num_cached_free_blocks == 8
    grower = make_request("grower", [1, 2, 3, 4], max_tokens=28, ignore_eos=True)
    scheduler.add_request(grower)
    step(scheduler, executor)  # grower runs, holding the only seat
    turn2 = make_request("turn2", history + [7, 8, 9])
    scheduler.add_request(turn2)
    assert scheduler.kv.num_protected_blocks("turn2") == 4
    run_until_done(scheduler, executor, "grower")  # took 4 plain + 4 cached blocks
    other_hashes = make_request("o", other).block_hashes
    extend_block_hashes(other_hashes, other, BLOCK)
    assert all(scheduler.kv.pool.get_cached_block(h) is None for h in other_hashes)
    assert scheduler.kv.pool.num_protected_evictions == 0
    run_until_done(scheduler, executor, "turn2")
    assert turn2.num_cached_tokens == 16
    assert scheduler.kv.protecting_ids() == set() and scheduler.kv.pool.protect_counts() == {}


def test_a_queued_request_loses_its_prefix_only_when_nothing_else_is_free():
    # The same, but the running request needs every block: the protected prefix is evicted
    # (no allocation fails that succeeded without protection) and recomputed on admission.
    scheduler = make_scheduler(block_size=BLOCK, num_blocks=8, max_seqs=1, budget=64)
    executor = FakeExecutor(vocab_size=50)
    history = list(range(10, 26))
    scheduler.add_request(make_request("turn1", history, max_tokens=1))
    run_until_done(scheduler, executor, "turn1")
    grower = make_request("grower", [1, 2, 3, 4], max_tokens=28, ignore_eos=True)  # 8 blocks
    scheduler.add_request(grower)
    step(scheduler, executor)
    turn2 = make_request("turn2", history + [7, 8, 9])
    scheduler.add_request(turn2)
    run_until_done(scheduler, executor, "grower")
    assert grower.finish_reason == "length"
    assert scheduler.kv.pool.num_protected_evictions == 4
    run_until_done(scheduler, executor, "turn2")
    assert turn2.num_cached_tokens == 0


def test_protection_is_released_on_admission_and_abort():
    scheduler = make_scheduler(block_size=BLOCK, num_blocks=16, max_seqs=1)
    executor = FakeExecutor(vocab_size=50)
    system = list(range(10, 18))
    scheduler.add_request(make_request("first", system + [1], max_tokens=1))
    run_until_done(scheduler, executor, "first")
    scheduler.add_request(make_request("runs", system + [2], max_tokens=4, ignore_eos=True))
    scheduler.add_request(make_request("aborted", system + [3]))
    scheduler.add_request(make_request("admitted", system + [4]))
    assert scheduler.kv.protecting_ids() == {"runs", "aborted", "admitted"}
    step(scheduler, executor)  # "runs" admitted: its hits are ref-counted now
    assert scheduler.kv.protecting_ids() == {"aborted", "admitted"}
    assert set(scheduler.kv.pool.protect_counts().values()) == {2}
    scheduler.abort_request("aborted")
    assert scheduler.kv.protecting_ids() == {"admitted"}
    assert set(scheduler.kv.pool.protect_counts().values()) == {1}
    scheduler.check_integrity()
    run_until_done(scheduler, executor, "admitted")
    assert scheduler.kv.pool.protect_counts() == {}


def test_a_preempted_request_protects_its_own_freed_prefix():
    # Two requests outgrow an 8-block pool: the later one is preempted (recompute) and put
    # back in the queue, protecting the blocks it just freed until it is admitted again.
    scheduler = make_scheduler(block_size=BLOCK, num_blocks=8, max_seqs=2, budget=64)
    executor = FakeExecutor(vocab_size=50)
    scheduler.add_request(make_request("a", list(range(10, 22)), max_tokens=12, ignore_eos=True))
    scheduler.add_request(make_request("b", list(range(30, 42)), max_tokens=12, ignore_eos=True))
    protected_after_preemption = None
    for _ in range(100):
        if not scheduler.has_unfinished():
            break
        plan = scheduler.schedule()
        if plan.preempted and protected_after_preemption is None:
            protected_after_preemption = scheduler.kv.num_protected_blocks(plan.preempted[0])
        scheduler.update(plan, executor.execute(plan))
        scheduler.check_integrity()
    assert not scheduler.has_unfinished()
    assert protected_after_preemption is not None and protected_after_preemption >= 3
