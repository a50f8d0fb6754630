"""Sliding-window models give back the KV blocks no later query can see.

The fake executor plays a windowed model (a token depends on its position and the last W
tokens, and nothing before the window is read), so a block given back too early, or a
placeholder entry read as if it held KV, changes the tokens or raises.
"""

from __future__ import annotations

import pytest
from core_driver import EOS, RequestSpec, make_request, make_scheduler, run

from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.scheduler import Scheduler
from cadence.executor.fake_executor import FakeExecutor

VOCAB = 50


def windowed_scheduler(window: int, **kwargs) -> Scheduler:
    base = make_scheduler(**kwargs)
    return Scheduler(base.sched, base.cache, sliding_window=window)


def test_blocks_before_the_window_are_freed_and_the_table_keeps_its_shape():
    kv = KVCacheManager(num_blocks=16, block_size=4, sliding_window=6)
    req = make_request("a", range(3, 23))  # 20 tokens
    kv.allocate(req, 20)
    req.num_computed_tokens = 20
    kv.cache_computed_blocks(req)
    # The next query (position 20) sees positions 15..20: blocks 0-2 (positions 0-11) are out.
    assert kv.release_out_of_window(req) == 3
    table = kv.get_block_table(req.req_id)
    assert len(table) == 5 and table[:3] == (table[3],) * 3
    assert kv.pool.num_free_blocks == 16 - 2
    kv.check_integrity()
    assert kv.release_out_of_window(req) == 0  # nothing new out of the window
    kv.free(req)
    assert kv.pool.num_free_blocks == 16
    kv.check_integrity()


def test_without_prefix_caching_blocks_are_freed_too():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False, sliding_window=4)
    req = make_request("a", range(3, 19))
    kv.allocate(req, 16)
    req.num_computed_tokens = 16
    assert kv.release_out_of_window(req) == 3  # next query at 16 sees 13..16
    table = kv.get_block_table("a")
    assert kv.lease(req) == table and kv.leased_blocks("a") == table[3:]
    kv.release_lease("a")
    assert kv.pool.num_free_blocks == 16
    kv.check_integrity()


@pytest.mark.parametrize("policy,budget", [("chunked", 16), ("eager", 64), ("chunked", 5)])
def test_windowed_requests_keep_window_sized_kv_and_their_tokens(policy, budget):
    window, block_size = 12, 4
    scheduler = windowed_scheduler(window, policy=policy, budget=budget, block_size=block_size,
                                   num_blocks=64)
    executor = FakeExecutor(VOCAB, sliding_window=window)
    specs = [RequestSpec(f"r{i}", [(7 * i + j) % 40 + 3 for j in range(30 + 9 * i)], max_tokens=40,
                         arrival_step=i) for i in range(4)]
    peak = 0
    original_update = scheduler.update

    def update(plan, out):
        nonlocal peak
        result = original_update(plan, out)
        for req in scheduler.running:
            live = len(scheduler.kv.get_block_table(req.req_id)) - scheduler.kv.num_dropped_blocks(req.req_id)
            peak = max(peak, live)
        scheduler.kv.check_integrity()
        return result

    scheduler.update = update
    result = run(scheduler, executor, specs)
    for s in specs:
        want = executor.reference_generate(s.prompt, s.max_tokens, (EOS,))
        assert result.outputs[s.req_id] == want, s.req_id
    # A live table never holds more than the window before a chunk plus the chunk.
    assert peak <= scheduler.kv.max_live_blocks(10**6, budget)
    assert scheduler.kv.pool.num_free_blocks == 64
    scheduler.kv.check_integrity()


def test_a_sequence_longer_than_the_pool_runs_when_its_window_fits():
    window, block_size = 8, 4
    # 10 blocks = 40 positions; the sequence is 30 + 50 = 80 tokens long.
    scheduler = windowed_scheduler(window, policy="chunked", budget=8, block_size=block_size,
                                   num_blocks=10, prefix_caching=False)
    executor = FakeExecutor(VOCAB, sliding_window=window)
    prompt = [(5 * j) % 40 + 3 for j in range(30)]
    result = run(scheduler, executor, [RequestSpec("long", prompt, max_tokens=50)])
    assert result.finish_reasons["long"] in ("length", "stop")
    assert result.outputs["long"] == executor.reference_generate(prompt, 50, (EOS,))
    # Without the window the same pool refuses it outright.
    full = make_scheduler(policy="chunked", budget=8, block_size=block_size, num_blocks=10,
                          prefix_caching=False)
    result = run(full, FakeExecutor(VOCAB, sliding_window=window),
                 [RequestSpec("long", prompt, max_tokens=50)])
    assert "long" in result.error_messages


def test_prefix_hits_after_the_window_moved_on_give_the_same_tokens():
    window = 8
    scheduler = windowed_scheduler(window, policy="chunked", budget=16, block_size=4, num_blocks=32)
    executor = FakeExecutor(VOCAB, sliding_window=window)
    shared = [(3 * j) % 40 + 3 for j in range(24)]
    specs = [RequestSpec("first", shared + [5, 6], max_tokens=10),
             RequestSpec("second", shared + [9, 4, 7], max_tokens=10, arrival_step=12)]
    result = run(scheduler, executor, specs)
    for s in specs:
        assert result.outputs[s.req_id] == executor.reference_generate(s.prompt, s.max_tokens, (EOS,))
    assert scheduler.kv.prefix_cache_hits > 0
    assert scheduler.kv.pool.num_free_blocks == 32
