"""Scheduler lifecycle: admission checks, stop conditions, aborts in every state, failures,
preemption and prefix caching with unchanged outputs."""

from __future__ import annotations

import pytest
from core_driver import (
    EOS,
    VOCAB,
    RequestSpec,
    ScriptedExecutor,
    make_request,
    make_scheduler,
    reference_outputs,
    run,
    step,
)

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import SampledToken, StepOutput
from cadence.core.request import RequestStatus
from cadence.core.scheduler import Scheduler
from cadence.executor.fake_executor import FakeExecutor


def drain(scheduler, executor, max_steps=1000):
    updates = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return updates
        updates += step(scheduler, executor)[1]
    raise AssertionError("did not finish")


def final(updates, req_id):
    (u,) = [u for u in updates if u.req_id == req_id and u.finished]
    return u


# -- admission ------------------------------------------------------------------------------
def test_scheduler_needs_resolved_num_blocks():
    with pytest.raises(ValueError, match="num_blocks"):
        Scheduler(SchedulerConfig(), CacheConfig())


def test_too_long_request_is_rejected_with_both_lengths():
    scheduler = make_scheduler(max_model_len=100)
    both_lengths = r"prompt \(90 tokens\) \+ max_tokens \(20\).*max_model_len \(100\)"
    with pytest.raises(ValueError, match=both_lengths):
        scheduler.add_request(make_request("a", range(90), max_tokens=20))
    assert not scheduler.has_unfinished()
    scheduler.add_request(make_request("b", range(80), max_tokens=20))  # exactly fits


def test_duplicate_id_is_rejected():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("a", [2]))


def test_empty_scheduler_plans_empty_steps():
    scheduler = make_scheduler()
    plan = scheduler.schedule()
    assert plan.is_empty and scheduler.update(plan, StepOutput(plan.step_id)) == []
    assert not scheduler.has_unfinished()


# -- stopping -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, script, want_tokens, want_reason",
    [
        ({}, [7, EOS, 9], [7, EOS], "stop"),
        ({"ignore_eos": True}, [7, EOS, 9], [7, EOS, 9], "length"),
        ({"stop_token_ids": (9,)}, [7, 9, 8], [7, 9], "stop"),
        ({"min_tokens": 3}, [EOS, 9, EOS, 4], [EOS, 9, EOS], "stop"),
        ({"min_tokens": 2, "stop_token_ids": (9,)}, [9, 5, 6], [9, 5, 6], "length"),
        ({}, [4, 5, 6], [4, 5, 6], "length"),
    ],
)
def test_stop_conditions(kwargs, script, want_tokens, want_reason):
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1, 2], max_tokens=3, **kwargs))
    updates = drain(scheduler, ScriptedExecutor({"a": script}))
    assert [t for u in updates for t in u.new_token_ids] == want_tokens
    u = final(updates, "a")
    assert u.finish_reason == want_reason and u.num_output_tokens == len(want_tokens)
    assert scheduler.get_request("a") is None  # forgotten once reported
    assert scheduler.stats().num_blocks_used == 0


def test_updates_carry_counts():
    scheduler = make_scheduler(block_size=2)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=2, ignore_eos=True))
    _, updates = step(scheduler, FakeExecutor(VOCAB))
    (u,) = updates
    assert (u.num_prompt_tokens, u.num_output_tokens, u.num_cached_tokens) == (3, 1, 0)
    assert len(u.new_token_ids) == 1 and not u.finished and u.finish_reason is None


# -- aborts ---------------------------------------------------------------------------------
def abort_and_check(scheduler, executor, req_id, reason="abort"):
    assert scheduler.abort_request(req_id, reason=reason)
    assert scheduler.get_request(req_id).is_finished
    scheduler.check_integrity()
    assert not scheduler.abort_request(req_id)  # already finished
    updates = drain(scheduler, executor)
    u = final(updates, req_id)
    assert u.finish_reason == reason and u.new_token_ids == ()
    assert [x.req_id for x in updates].count(req_id) == 1  # reported exactly once
    return updates


def test_abort_waiting_request():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1, 2]))
    abort_and_check(scheduler, FakeExecutor(VOCAB), "a")


def test_abort_mid_prefill_frees_blocks_at_once():
    scheduler = make_scheduler(budget=8, block_size=4)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", range(30)))
    step(scheduler, executor)
    assert scheduler.stats().num_blocks_used == 2
    scheduler.abort_request("a")
    assert scheduler.stats().num_blocks_used == 0
    assert scheduler.has_unfinished()  # the final update is still to be delivered
    plan = scheduler.schedule()
    assert plan.is_empty
    (u,) = scheduler.update(plan, StepOutput(plan.step_id))
    assert u.finished and u.finish_reason == "abort"
    assert not scheduler.has_unfinished()


def test_abort_running_request_between_schedule_and_update():
    scheduler = make_scheduler()
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=5, ignore_eos=True))
    scheduler.add_request(make_request("b", [4, 5, 6], max_tokens=5, ignore_eos=True))
    step(scheduler, executor)
    plan = scheduler.schedule()
    out = executor.execute(plan)
    scheduler.abort_request("a")
    updates = scheduler.update(plan, out)
    assert {(u.req_id, u.finished, u.finish_reason) for u in updates} == {
        ("b", False, None),
        ("a", True, "abort"),
    }
    scheduler.check_integrity()


def test_abort_preempted_request():
    scheduler = make_scheduler(block_size=2, num_blocks=6)
    executor = FakeExecutor(VOCAB)
    for name in "abc":
        scheduler.add_request(make_request(name, [1, 2, 3], max_tokens=8, ignore_eos=True))
    while not (plan := step(scheduler, executor)[0]).preempted:
        pass
    victim = plan.preempted[0]
    assert scheduler.get_request(victim).status is RequestStatus.PREEMPTED
    abort_and_check(scheduler, executor, victim)


def test_finish_request_with_stop_and_unknown_ids():
    scheduler = make_scheduler()
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", [1, 2], max_tokens=10, ignore_eos=True))
    step(scheduler, executor)
    assert scheduler.finish_request("a", reason="stop")
    assert final(drain(scheduler, executor), "a").finish_reason == "stop"
    assert not scheduler.finish_request("nope")
    assert not scheduler.abort_request("nope")
    scheduler.add_request(make_request("b", [1]))
    with pytest.raises(ValueError, match="unknown finish reason"):
        scheduler.finish_request("b", reason="bored")


# -- requests that can never fit ------------------------------------------------------------
def test_prompt_larger_than_the_pool_fails_with_a_clear_error():
    scheduler = make_scheduler(block_size=4, num_blocks=3)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("huge", range(20)))
    scheduler.add_request(make_request("ok", range(5), max_tokens=2, ignore_eos=True))
    updates = drain(scheduler, executor)
    u = final(updates, "huge")
    assert u.finish_reason == "error"
    assert "needs 5 KV cache blocks" in u.error_message and "only 3 blocks" in u.error_message
    assert final(updates, "ok").finish_reason == "length"


def test_request_outgrowing_the_pool_fails_instead_of_spinning():
    scheduler = make_scheduler(block_size=2, num_blocks=2)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("grows", [1, 2, 3], max_tokens=10, ignore_eos=True))
    updates = drain(scheduler, executor, max_steps=20)
    u = final(updates, "grows")
    assert u.finish_reason == "error" and u.num_output_tokens == 2  # 4 positions fit, not 5
    assert "KV cache blocks" in u.error_message


# -- update() misuse ------------------------------------------------------------------------
def test_missing_sampled_token_is_a_clear_error_and_changes_nothing():
    scheduler = make_scheduler()
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", [1, 2]))
    scheduler.add_request(make_request("b", [3, 4]))
    plan = scheduler.schedule()
    out = executor.execute(plan)
    partial = StepOutput(plan.step_id, {"a": out.sampled["a"]})
    with pytest.raises(ValueError, match="sampled no token for b"):
        scheduler.update(plan, partial)
    assert scheduler.get_request("a").num_computed_tokens == 0
    assert scheduler.get_request("a").num_output_tokens == 0
    assert len(scheduler.update(plan, out)) == 2  # the plan is still the one to update


def test_mismatched_or_stale_plans_are_refused():
    scheduler = make_scheduler()
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", [1, 2], max_tokens=4, ignore_eos=True))
    plan = scheduler.schedule()
    out = executor.execute(plan)
    with pytest.raises(ValueError, match="StepOutput of step"):
        scheduler.update(plan, StepOutput(plan.step_id + 1))
    scheduler.update(plan, out)
    with pytest.raises(ValueError, match="latest scheduled step"):
        scheduler.update(plan, out)
    bad = StepOutput(0, {"a": SampledToken(-3)})
    plan = scheduler.schedule()
    with pytest.raises(ValueError, match="bad token id"):
        scheduler.update(plan, StepOutput(plan.step_id, bad.sampled))


def test_a_plan_never_updated_is_dropped_and_rescheduled():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(10)))
    first = scheduler.schedule()  # say its forward failed: no update
    second = scheduler.schedule()
    assert [(c.req_id, c.start_pos, c.token_ids) for c in first.chunks] == [
        (c.req_id, c.start_pos, c.token_ids) for c in second.chunks
    ]
    scheduler.check_integrity()


# -- preemption and prefix caching keep outputs ---------------------------------------------
@pytest.mark.parametrize("policy", ["eager", "chunked"])
def test_small_pool_preempts_and_outputs_are_unchanged(policy):
    specs = [
        RequestSpec(
            f"r{i}", list(range(i, i + 7)), max_tokens=20, sampling_kwargs={"ignore_eos": True}
        )
        for i in range(4)
    ]
    executor = FakeExecutor(VOCAB)
    result = run(make_scheduler(policy, budget=32, block_size=4, num_blocks=10), executor, specs)
    assert result.num_preemptions > 0
    for s in specs:
        assert result.finish_reasons[s.req_id] == "length"
        assert result.outputs[s.req_id] == reference_outputs(executor, s)
    # A preempted request recomputes its output tokens too: some chunk restarts at 0 with
    # more than the prompt.
    assert any(start == 0 and end > 7 for _, start, end in result.computed)


def shared_prefix_specs(second_arrival: int):
    shared = [(7 * i) % VOCAB for i in range(1000)]
    return shared, [
        RequestSpec(
            "first", shared + [1, 2, 3], max_tokens=5, sampling_kwargs={"ignore_eos": True}
        ),
        RequestSpec("second", shared + [4, 5, 6, 7], max_tokens=5, arrival_step=second_arrival,
                    sampling_kwargs={"ignore_eos": True}),
    ]


@pytest.mark.parametrize("policy", ["eager", "chunked"])
def test_shared_1000_token_prefix_is_computed_once(policy):
    # The second request arrives after the first finished its prefill (chunked: 1003 tokens at
    # 256 per step take 4 steps).
    shared, specs = shared_prefix_specs(second_arrival=6)
    executor = FakeExecutor(VOCAB)
    scheduler = make_scheduler(policy, budget=256, block_size=16, num_blocks=200)
    result = run(scheduler, executor, specs)
    full_shared = (len(shared) // 16) * 16  # 992: the shared full blocks
    second_chunks = [c for p in result.plans for c in p.chunks if c.req_id == "second"]
    assert second_chunks[0].start_pos == full_shared
    prefill = [c for c in second_chunks if c.is_prefill]
    assert sum(c.num_new_tokens for c in prefill) == len(specs[1].prompt) - full_shared
    for s in specs:
        assert result.outputs[s.req_id] == reference_outputs(executor, s)
    stats = result.stats
    assert stats.prefix_cache_hits == full_shared
    assert stats.prefix_cache_queries == len(specs[0].prompt) + len(specs[1].prompt)


def test_prefix_hit_while_the_first_request_is_still_decoding():
    _, specs = shared_prefix_specs(second_arrival=5)
    specs[0].max_tokens = 30
    executor = FakeExecutor(VOCAB)
    scheduler = make_scheduler("chunked", budget=256, block_size=16, num_blocks=200)
    result = run(scheduler, executor, specs)
    second_chunks = [c for p in result.plans for c in p.chunks if c.req_id == "second"]
    assert second_chunks[0].start_pos == 992
    assert result.finish_reasons["first"] == "length"
    for s in specs:
        assert result.outputs[s.req_id] == reference_outputs(executor, s)


def test_prefix_caching_off_computes_everything():
    _, specs = shared_prefix_specs(second_arrival=6)
    executor = FakeExecutor(VOCAB)
    scheduler = make_scheduler(budget=256, block_size=16, num_blocks=200, prefix_caching=False)
    result = run(scheduler, executor, specs)
    second_chunks = [c for p in result.plans for c in p.chunks if c.req_id == "second"]
    assert second_chunks[0].start_pos == 0
    assert result.stats.prefix_cache_queries == 0
    for s in specs:
        assert result.outputs[s.req_id] == reference_outputs(executor, s)


def test_stats_snapshot_is_consistent():
    scheduler = make_scheduler(block_size=4, num_blocks=16)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", range(10), max_tokens=3, ignore_eos=True))
    scheduler.add_request(make_request("b", range(10, 20), max_tokens=3, ignore_eos=True))
    step(scheduler, executor)
    s = scheduler.stats()
    assert (s.num_running, s.num_waiting, s.num_blocks_total) == (2, 0, 16)
    assert s.num_blocks_used == 6 and s.num_blocks_free == 10
    drain(scheduler, executor)
    s = scheduler.stats()
    assert s.num_blocks_used == 0 and s.num_blocks_free == 16
    assert s.num_blocks_cached == 6  # their full blocks stay reusable
    assert 0.0 <= s.prefix_cache_hit_rate <= 1.0 and s.kv_cache_usage == 0.0
