"""Priority that preempts: with scheduling="priority", a waiting request that outranks running
ones takes a seat (or blocks) from the lowest-ranked of them and starts in the very next step;
the preempted requests finish later with the same tokens (they are recomputed)."""

from __future__ import annotations

import pytest
from core_driver import VOCAB, RequestSpec, make_request, make_scheduler, run, step

from cadence.executor.fake_executor import FakeExecutor

POLICIES = ("chunked", "slo", "eager")


def start(scheduler, executor, names_priorities, prompt_len=6, max_tokens=40):
    for i, (name, priority) in enumerate(names_priorities):
        scheduler.add_request(make_request(name, range(3, 3 + prompt_len), max_tokens=max_tokens,
                                           priority=priority, ignore_eos=True,
                                           arrival_time=float(i)))
    while any(scheduler.get_request(n).num_output_tokens == 0 for n, _ in names_priorities):
        step(scheduler, executor)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_higher_priority_request_takes_a_seat_when_the_cap_is_full(policy):
    scheduler = make_scheduler(policy, budget=64, max_seqs=2, scheduling="priority")
    executor = FakeExecutor(VOCAB)
    start(scheduler, executor, [("low", 5), ("mid", 3)])
    scheduler.add_request(make_request("urgent", [9] * 5, max_tokens=4, priority=0,
                                       arrival_time=10.0))
    plan, _ = step(scheduler, executor)
    assert plan.preempted == ("low",), "the lowest-priority running request gives its seat"
    assert "urgent" in {c.req_id for c in plan.chunks}, "it starts in the next step"
    assert scheduler.get_request("urgent").num_output_tokens == 1
    assert scheduler.get_request("mid").num_output_tokens >= 2, "mid keeps decoding"
    scheduler.check_integrity()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_higher_priority_request_takes_blocks_when_the_pool_is_full(policy):
    # 12 blocks of 4 tokens: two running requests hold 5 blocks each; "urgent" needs 4.
    scheduler = make_scheduler(policy, budget=64, max_seqs=8, block_size=4, num_blocks=12,
                               scheduling="priority")
    executor = FakeExecutor(VOCAB)
    start(scheduler, executor, [("low", 5), ("mid", 3)], prompt_len=18)
    assert scheduler.stats().num_blocks_free < 4
    scheduler.add_request(make_request("urgent", [9] * 15, max_tokens=2, priority=0,
                                       arrival_time=10.0))
    plan, _ = step(scheduler, executor)
    assert plan.preempted == ("low",)
    assert "urgent" in {c.req_id for c in plan.chunks}
    scheduler.check_integrity()


def test_equal_or_lower_priority_waits_and_fcfs_never_preempts_for_arrivals():
    for scheduling, priority in (("priority", 5), ("priority", 7), ("fcfs", 0)):
        scheduler = make_scheduler("chunked", budget=64, max_seqs=2, scheduling=scheduling)
        executor = FakeExecutor(VOCAB)
        start(scheduler, executor, [("a", 5), ("b", 5)])
        scheduler.add_request(make_request("late", [9] * 5, max_tokens=2, priority=priority,
                                           arrival_time=10.0))
        plan, _ = step(scheduler, executor)
        assert plan.preempted == () and "late" not in {c.req_id for c in plan.chunks}


@pytest.mark.parametrize("policy", POLICIES)
def test_preempted_requests_finish_with_the_tokens_of_an_uncontended_run(policy):
    """Low-priority requests are preempted again and again by urgent arrivals; every request
    ends with exactly the tokens it gets alone (the fake executor's tokens depend only on the
    request's own sequence, like greedy decoding)."""
    specs = [RequestSpec(f"bg{i}", list(range(4 + i, 30 + i)), 30, arrival_step=0, priority=9)
             for i in range(3)]
    specs += [RequestSpec(f"urgent{i}", [7 + i] * 9, 6, arrival_step=3 + 5 * i, priority=0)
              for i in range(4)]
    contended = run(make_scheduler(policy, budget=32, max_seqs=2, block_size=4, num_blocks=40,
                                   scheduling="priority"), FakeExecutor(VOCAB), specs)
    roomy = run(make_scheduler(policy, budget=4096, max_seqs=64, num_blocks=4096),
                FakeExecutor(VOCAB), specs)
    assert contended.outputs == roomy.outputs
    assert contended.num_preemptions > 0


def test_room_made_for_a_long_urgent_prompt_is_not_taken_by_a_short_one():
    """Regression (found by the slo property tests): with short-first partial prefills, a
    short low-priority prompt overtook the long urgent one into the seat that was freed for it;
    the next step preempted again, forever."""
    scheduler = make_scheduler("chunked", budget=64, max_seqs=1, threshold=3,
                               scheduling="priority", partial_prefills=4)
    executor = FakeExecutor(VOCAB)
    start(scheduler, executor, [("running", 5)])
    scheduler.add_request(make_request("short", [9] * 2, max_tokens=2, priority=4,
                                       arrival_time=10.0))
    scheduler.add_request(make_request("urgent", [8] * 20, max_tokens=2, priority=0,
                                       arrival_time=11.0))
    plan, _ = step(scheduler, executor)
    assert plan.preempted == ("running",)
    assert [c.req_id for c in plan.chunks] == ["urgent"]
    for _ in range(60):
        if not scheduler.has_unfinished():
            break
        step(scheduler, executor)
    assert not scheduler.has_unfinished()
    assert scheduler.stats().num_preemptions_total <= 3
