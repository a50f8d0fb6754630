"""What each policy puts in a step: chunked never stalls decodes, eager reproduces the stall."""

from __future__ import annotations

from core_driver import VOCAB, chunk_sizes, make_request, make_scheduler, step

from cadence.executor.fake_executor import FakeExecutor


def start_decoding(scheduler, executor, req_id="a"):
    scheduler.add_request(make_request(req_id, [1, 2, 3], max_tokens=50, ignore_eos=True))
    step(scheduler, executor)  # prefill + first token
    req = scheduler.get_request(req_id)
    assert req.num_output_tokens == 1 and req.num_remaining_tokens == 1


def test_chunked_keeps_decoding_while_a_long_prompt_is_chunked():
    scheduler, executor = make_scheduler("chunked", budget=16), FakeExecutor(VOCAB)
    start_decoding(scheduler, executor)
    scheduler.add_request(make_request("long", range(100), max_tokens=2))
    sizes = []
    while scheduler.get_request("long").num_output_tokens == 0:
        plan, _ = step(scheduler, executor)
        sizes.append(chunk_sizes(plan))
        # Decode first, prompt chunk after it.
        assert [c.req_id for c in plan.chunks][0] == "a" and not plan.chunks[0].is_prefill
    assert all(s["a"] == 1 for s in sizes)
    assert [s["long"] for s in sizes] == [15] * 6 + [10]
    assert all(sum(s.values()) <= 16 for s in sizes)


def test_chunked_threshold_caps_one_requests_chunk():
    scheduler, executor = make_scheduler("chunked", budget=16, threshold=4), FakeExecutor(VOCAB)
    for i, name in enumerate("xyz"):
        scheduler.add_request(make_request(name, range(10 * i, 10 * i + 10)))
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"x": 4, "y": 4, "z": 4}
    plan, _ = step(scheduler, executor)
    # Part-way prompts continue first (in order), then the budget stops at 16.
    assert chunk_sizes(plan) == {"x": 4, "y": 4, "z": 4}
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"x": 2, "y": 2, "z": 2} and all(c.sample for c in plan.chunks)


def test_eager_runs_a_long_prompt_whole_and_stalls_decodes():
    scheduler, executor = make_scheduler("eager", budget=16), FakeExecutor(VOCAB)
    start_decoding(scheduler, executor)
    scheduler.add_request(make_request("long", range(40), max_tokens=2))
    plan, _ = step(scheduler, executor)
    # The whole 40-token prompt, alone: over the budget by design, and "a" stalls.
    assert chunk_sizes(plan) == {"long": 40} and plan.chunks[0].sample
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"a": 1, "long": 1}


def test_eager_admits_whole_prompts_while_they_fit_the_budget():
    scheduler, executor = make_scheduler("eager", budget=16), FakeExecutor(VOCAB)
    start_decoding(scheduler, executor)
    for i, name in enumerate("xyz"):
        scheduler.add_request(make_request(name, range(10 * i, 10 * i + 6)))
    plan, _ = step(scheduler, executor)
    # Prompts first; the budget left (4) then goes to the decode.
    assert chunk_sizes(plan) == {"x": 6, "y": 6, "a": 1}
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"z": 6, "a": 1, "x": 1, "y": 1}


def test_eager_prompt_that_does_not_fit_waits_for_an_empty_step():
    scheduler, executor = make_scheduler("eager", budget=16), FakeExecutor(VOCAB)
    scheduler.add_request(make_request("x", range(10)))
    scheduler.add_request(make_request("big", range(100, 130)))
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"x": 10}  # head-of-line: big waits, nothing overtakes it
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"big": 30}  # alone: x's decode stalls behind it


def test_max_num_seqs_caps_running_requests():
    scheduler, executor = make_scheduler("chunked", budget=64, max_seqs=2), FakeExecutor(VOCAB)
    for name in "wxyz":
        scheduler.add_request(make_request(name, range(3), max_tokens=3, ignore_eos=True))
    for i in range(3):
        plan, _ = step(scheduler, executor)
        assert set(chunk_sizes(plan)) == {"w", "x"}
        stats = scheduler.stats()
        assert (stats.num_running, stats.num_waiting) == ((2, 2) if i < 2 else (0, 2))
    plan, _ = step(scheduler, executor)
    assert set(chunk_sizes(plan)) == {"y", "z"}


def first_scheduled_order(scheduling: str) -> list[str]:
    scheduler = make_scheduler("chunked", budget=64, max_seqs=1, scheduling=scheduling)
    executor = FakeExecutor(VOCAB)
    for i, (name, priority) in enumerate([("a", 2), ("b", 0), ("c", 1), ("d", 0)]):
        scheduler.add_request(
            make_request(name, [5, 6], max_tokens=1, priority=priority, arrival_time=float(i))
        )
    order = []
    while scheduler.has_unfinished():
        plan, _ = step(scheduler, executor)
        order += [c.req_id for c in plan.chunks if c.req_id not in order]
    return order


def test_fcfs_serves_in_arrival_order():
    assert first_scheduled_order("fcfs") == ["a", "b", "c", "d"]


def test_priority_serves_lower_values_first_then_arrival():
    assert first_scheduled_order("priority") == ["b", "d", "c", "a"]


def test_priority_preempts_the_lowest_priority_request():
    # 6 blocks of 2 tokens: three 3-token prompts take 2 blocks each; the first decode that
    # needs a new block must preempt someone: the lowest priority (highest value) one.
    scheduler = make_scheduler(
        "chunked", budget=64, block_size=2, num_blocks=6, scheduling="priority"
    )
    executor = FakeExecutor(VOCAB)
    for i, (name, priority) in enumerate([("low", 5), ("high", 0), ("mid", 1)]):
        scheduler.add_request(
            make_request(name, [1, 2, 3], max_tokens=8, priority=priority, ignore_eos=True,
                         arrival_time=float(i))
        )
    preempted = []
    while not preempted:
        plan, _ = step(scheduler, executor)
        preempted = list(plan.preempted)
    assert preempted == ["low"]
    assert scheduler.get_request("low").num_computed_tokens == 0
    assert scheduler.stats().num_preemptions_total == 1


def test_fcfs_preempts_the_latest_arrival():
    scheduler = make_scheduler("chunked", budget=64, block_size=2, num_blocks=6)
    executor = FakeExecutor(VOCAB)
    for i, name in enumerate(["first", "second", "third"]):
        scheduler.add_request(
            make_request(name, [1, 2, 3], max_tokens=8, ignore_eos=True, priority=-i,
                         arrival_time=float(i))
        )
    preempted = []
    while not preempted:
        plan, _ = step(scheduler, executor)
        preempted = list(plan.preempted)
    assert preempted == ["third"]  # FCFS ignores priority


def test_eager_does_not_admit_a_prompt_into_blocks_a_decode_needs():
    # 4 blocks of 2. "a" has computed 4 positions (2 blocks) and its next decode needs a third;
    # "x" needs 2 blocks. Admitting x would force preempting it again in the same step.
    scheduler = make_scheduler("eager", budget=16, block_size=2, num_blocks=4)
    executor = FakeExecutor(VOCAB)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=3, ignore_eos=True))
    step(scheduler, executor)
    step(scheduler, executor)
    scheduler.add_request(make_request("x", [7, 8, 9, 10], max_tokens=1))
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"a": 1} and not plan.preempted
    plan, _ = step(scheduler, executor)
    assert chunk_sizes(plan) == {"x": 4}
    assert scheduler.stats().num_preemptions_total == 0
