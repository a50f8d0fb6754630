"""Property tests: random arrivals, lengths, priorities, aborts and tiny pools under every
policy; each run is checked step by step (see core_driver.run) and against an unconstrained
run (huge budget, big pool): scheduling never changes the tokens."""

from __future__ import annotations

import random

from core_driver import EOS, VOCAB, RequestSpec, make_scheduler, reference_outputs, run
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cadence.executor.fake_executor import FakeExecutor

MAX_MODEL_LEN = 96


@st.composite
def workloads(draw):
    # A few shared prefixes make prefix-cache hits (and shared blocks under preemption) common.
    prefixes = draw(
        st.lists(st.lists(st.integers(3, 9), min_size=1, max_size=24), min_size=1, max_size=3)
    )
    specs = []
    for i in range(draw(st.integers(1, 8))):
        prefix = draw(st.sampled_from(prefixes)) if draw(st.booleans()) else []
        tail = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if prefix else 1, max_size=30))
        sampling_kwargs = {}
        if draw(st.integers(0, 3)) == 0:
            sampling_kwargs["ignore_eos"] = True
        if draw(st.integers(0, 3)) == 0:
            sampling_kwargs["min_tokens"] = draw(st.integers(0, 6))
        if draw(st.integers(0, 3)) == 0:
            sampling_kwargs["stop_token_ids"] = (draw(st.integers(0, VOCAB - 1)),)
        specs.append(
            RequestSpec(
                req_id=f"r{i}",
                prompt=prefix + tail,
                max_tokens=draw(st.integers(1, 32)),
                arrival_step=draw(st.integers(0, 6)),
                priority=draw(st.integers(0, 3)),
                abort_step=draw(st.one_of(st.none(), st.integers(0, 40))),
                abort_mid_step=draw(st.booleans()),
                abort_reason=draw(st.sampled_from(["abort", "stop"])),
                sampling_kwargs=sampling_kwargs,
            )
        )
    return specs


def draw_limits(draw) -> dict:
    """The scheduler settings every policy's config strategy draws (after its own ones)."""
    return dict(
        scheduling=draw(st.sampled_from(["fcfs", "priority"])),
        budget=draw(st.integers(1, 48)),
        max_seqs=draw(st.integers(1, 8)),
        block_size=draw(st.sampled_from([1, 2, 4, 8])),
        threshold=draw(st.sampled_from([0, 0, 1, 3, 8])),
        prefix_caching=draw(st.booleans()),
    )


@st.composite
def scheduler_configs(draw):
    policy = draw(st.sampled_from(["eager", "chunked"]))
    # chunked also with several partial prefills (short prompts overtaking long ones).
    partial = draw(st.sampled_from([1, 3])) if policy == "chunked" else 1
    # Sometimes a host tier for swap preemption (small: it fills up and falls back too).
    swap = draw(st.sampled_from([0, 0, 4, 64]))
    # Sometimes a disk tier (swap when the host tier is full or absent, prefix spill).
    disk = draw(st.sampled_from([0, 0, 3, 64]))
    return dict(policy=policy, partial_prefills=partial, swap_blocks=swap, disk_blocks=disk,
                **draw_limits(draw))


def draw_num_blocks(data, specs, block_size: int) -> int:
    """Mostly a pool that fits any one request but not all of them (preemption territory),
    sometimes one too small for some requests (they must fail cleanly, not hang)."""
    largest = max((-(-(len(s.prompt) + s.max_tokens) // block_size) for s in specs), default=1)
    if data.draw(st.integers(0, 3), label="tiny pool") == 0:
        return data.draw(st.integers(1, largest), label="num_blocks")
    return data.draw(st.integers(largest, 2 * largest), label="num_blocks")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=workloads(), cfg=scheduler_configs(), data=st.data())
def test_scheduling_never_changes_tokens(specs, cfg, data):
    executor = FakeExecutor(VOCAB, eos_token_id=EOS, eos_one_in=24)
    specs = [s for s in specs if len(s.prompt) + s.max_tokens <= MAX_MODEL_LEN]
    num_blocks = draw_num_blocks(data, specs, cfg["block_size"])
    scheduler = make_scheduler(num_blocks=num_blocks, max_model_len=MAX_MODEL_LEN, **cfg)
    if cfg["disk_blocks"] and data.draw(st.booleans(), label="disk faults"):
        # A disk that fails some writes and reads: those fall back to recompute.
        rng = random.Random(data.draw(st.integers(0, 2**16), label="fault seed"))
        executor.disk_fault = lambda op, slot: rng.random() < 0.3
    result = run(scheduler, executor, specs)
    event(f"preempted: {result.num_preemptions > 0}")
    event(f"disk swap: {result.stats.num_disk_swap_preemptions_total > 0}")
    event(f"prefix reload: {result.stats.num_prefix_blocks_reloaded_total > 0}")
    event(f"prefix hits: {result.stats.prefix_cache_hits > 0}")
    for reason in sorted(set(result.finish_reasons.values())):
        event(f"some finished with {reason}")

    check_against_reference(result, executor, specs, cfg["block_size"], num_blocks)
    check_computed_once(result)


def check_against_reference(result, executor, specs, block_size: int, num_blocks: int) -> None:
    """Each request's tokens and finish reason against its unscheduled run on `executor`."""
    for s in specs:
        reason = result.finish_reasons[s.req_id]
        got = result.outputs[s.req_id]
        want = reference_outputs(executor, s)
        cut_short = s.abort_step is not None and got != want
        if reason in ("stop", "length") and not cut_short:
            assert got == want, f"{s.req_id} ({reason}) differs from the unscheduled run"
            # The last sampled token is never computed; every other position is.
            assert result.final_num_tokens[s.req_id] == len(s.prompt) + len(want)
        elif reason in ("abort", "stop"):
            assert s.abort_step is not None and reason == s.abort_reason
            assert got == want[: len(got)]
        else:
            assert reason == "error", reason
            assert got == want[: len(got)]
            # Only a request that cannot fit the whole pool may fail.
            needed = -(-result.final_num_tokens[s.req_id] // block_size)
            assert needed > num_blocks, result.error_messages[s.req_id]
            assert "KV cache blocks" in result.error_messages[s.req_id]


def check_computed_once(result) -> None:
    """Each position is computed once per (re)start: without preemption, exactly once overall."""
    if result.num_preemptions == 0:
        seen: set[tuple[str, int]] = set()
        for req_id, start, end in result.computed:
            for pos in range(start, end):
                assert (req_id, pos) not in seen, f"{req_id} position {pos} computed twice"
                seen.add((req_id, pos))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=workloads(), cfg=scheduler_configs(), data=st.data())
def test_constrained_run_equals_unconstrained_run(specs, cfg, data):
    """Same requests, no aborts: a tight budget and pool give the tokens a roomy setup gives."""
    specs = [s for s in specs if len(s.prompt) + s.max_tokens <= MAX_MODEL_LEN]
    num_blocks = draw_num_blocks(data, specs, cfg["block_size"])
    for s in specs:
        s.abort_step = None  # aborts would cut the runs at different points
    roomy = run(
        make_scheduler(budget=4096, max_seqs=64, num_blocks=4096, max_model_len=MAX_MODEL_LEN),
        FakeExecutor(VOCAB, eos_token_id=EOS, eos_one_in=24),
        specs,
    )
    tight = run(
        make_scheduler(num_blocks=num_blocks, max_model_len=MAX_MODEL_LEN, **cfg),
        FakeExecutor(VOCAB, eos_token_id=EOS, eos_one_in=24),
        specs,
    )
    event(f"preempted: {tight.num_preemptions > 0}")
    check_matches_roomy(tight, roomy, specs)


def check_matches_roomy(tight, roomy, specs) -> None:
    """The constrained run gives the roomy run's tokens (a prefix of them where it failed)."""
    assert set(roomy.finish_reasons.values()) <= {"stop", "length"}
    for s in specs:
        if tight.finish_reasons[s.req_id] == "error":
            got = tight.outputs[s.req_id]
            assert got == roomy.outputs[s.req_id][: len(got)]
        else:
            assert tight.outputs[s.req_id] == roomy.outputs[s.req_id]
            assert tight.finish_reasons[s.req_id] == roomy.finish_reasons[s.req_id]
