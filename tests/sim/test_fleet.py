"""The N-replica simulator (cadence.sim.fleet): simulated engines behind the router's own replica
policies, conversations in closed loops."""

from __future__ import annotations

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.step_cost import StepCostCoefficients, StepFeatures
from cadence.core.step_profile import DEFAULT_SHAPES, build_plan
from cadence.sim.conversations import (Conversation, ConversationWorkload, Turn,
                                       from_replica_bench, synthetic)
from cadence.sim.cost_model import RooflineCostModel
from cadence.sim.fleet import simulate_fleet
from cadence.sim.hardware import get_profile
from cadence.sim.model_shape import SMOLLM2_135M

COST = RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core"))
SCHED = SchedulerConfig(policy="chunked")


def _run(workload, n, policy, blocks=1 << 14, **kw):
    return simulate_fleet(workload, n, policy, COST, SCHED,
                          CacheConfig(block_size=16, num_blocks=blocks), **kw)


@pytest.mark.parametrize("n", [1, 4])
def test_every_turn_is_served_once_and_runs_are_deterministic(n):
    w = synthetic(num_conversations=6, rate=2.0, doc_tokens=100, seed=3)
    a = _run(w, n, "cache-aware", hop_s=0.01)
    b = _run(w, n, "cache-aware", hop_s=0.01)
    assert len(a.requests) == w.num_requests and sum(a.per_replica()) == w.num_requests
    assert [(r.req_id, r.replica, r.ttft_s) for r in a.requests] == \
        [(r.req_id, r.replica, r.ttft_s) for r in b.requests]
    for r in a.requests:
        assert r.output_tokens == 32 and r.ttft_s >= 0.01 and 0 <= r.cached_tokens < r.prompt_tokens
    # A conversation's turns come in order, each after the previous one ended (closed loop).
    by_conv = {}
    for r in sorted(a.requests, key=lambda r: (r.conv_id, r.turn)):
        prev = by_conv.get(r.conv_id)
        if prev is not None:
            assert r.turn == prev.turn + 1 and r.sent_s >= prev.finished_s
            assert r.prompt_tokens == prev.prompt_tokens + prev.output_tokens + 30
        by_conv[r.conv_id] = r


def test_cache_aware_keeps_conversations_where_their_prefix_is_and_round_robin_spreads_them():
    w = synthetic(num_conversations=8, rate=0.5, doc_tokens=300, seed=1)
    rr = _run(w, 2, "round-robin")
    ca = _run(w, 2, "cache-aware")
    assert max(rr.per_replica()) - min(rr.per_replica()) <= 1
    replicas_per_conv = {}
    for r in ca.requests:
        replicas_per_conv.setdefault(r.conv_id, set()).add(r.replica)
    assert sum(len(s) for s in replicas_per_conv.values()) <= len(replicas_per_conv) + 1
    assert set(ca.per_replica()) != {0} and min(ca.per_replica()) > 0
    # Its hits: every turn after the first finds the conversation's history.
    assert ca.prefix_hit_rate > rr.prefix_hit_rate


def test_a_fleet_cache_that_holds_what_one_replica_cannot_doubles_the_hit_rate():
    # The live conversations (500-800 tokens each) need more than 120 blocks (1920 tokens) of
    # one replica, less than the two replicas' together. Round-robin sends every conversation
    # to both and evicts (here 0.24 hit vs 0.82); with 160 blocks it keeps half (0.55 vs 0.83).
    w = synthetic(num_conversations=24, rate=1.0, doc_tokens=400, seed=0)
    rr = _run(w, 2, "round-robin", blocks=120)
    ca = _run(w, 2, "cache-aware", blocks=120)
    assert ca.prefix_hit_rate >= 2 * rr.prefix_hit_rate, (ca.prefix_hit_rate,
                                                          rr.prefix_hit_rate)
    assert ca.ttft_p50 < rr.ttft_p50


def test_replays_a_replica_bench_run():
    records = []
    for conv, system, prompts in ((0, 0, (120, 180, 240)), (1, 1, (90, 150))):
        for k, p in enumerate(prompts):
            records.append({"conversation": conv, "turn": k, "system": system,
                            "prompt_tokens": p, "output_tokens": 20, "think": 0.1,
                            "sent": 0.5 * conv + 2.0 * k})
    row = {"system_tokens": {"0": 40, "1": 30}, "records": records}
    w = from_replica_bench(row)
    assert [t.new_tokens for t in w.conversations[0].turns] == [80, 40, 40]
    assert [c.start_s for c in w.conversations] == [0.0, 0.5]
    sim = _run(w, 2, "least-loaded")
    assert sorted(r.prompt_tokens for r in sim.requests) == sorted(
        r["prompt_tokens"] for r in records)


def _two_arrivals(long_tokens: int, short_tokens: int, gap_s: float) -> ConversationWorkload:
    turn = lambda n: (Turn(n, 4, 0.0),)  # noqa: E731
    return ConversationWorkload((Conversation(0, 0.0, 0, turn(long_tokens)),
                                 Conversation(1, gap_s, 1, turn(short_tokens))),
                                {0: 16, 1: 16})


@pytest.mark.parametrize("interject", [True, False])
def test_a_short_prompt_runs_inside_a_long_step_as_the_engine_interjects_it(interject):
    # A 1500-token prompt's step is computing when a 100-token one arrives: the engine runs the
    # short one between two layers (its first token long before the long one's), unless
    # interjection is off (it then waits for the step's end).
    sched = SchedulerConfig(interject_short_prompts=interject)
    res = simulate_fleet(_two_arrivals(1500, 100, 0.05), 1, "round-robin", COST, sched,
                         CacheConfig(block_size=16, num_blocks=1 << 12))
    long, short = sorted(res.requests, key=lambda r: r.conv_id)
    alone = simulate_fleet(_two_arrivals(1500, 100, 1e6), 1, "round-robin", COST, sched,
                           CacheConfig(block_size=16, num_blocks=1 << 12)).requests
    short_alone = next(r for r in alone if r.conv_id == 1).ttft_s
    long_alone = next(r for r in alone if r.conv_id == 0).ttft_s
    if interject:
        assert short.ttft_s == pytest.approx(short_alone)
        # The long step ended later by the interjected step's time.
        assert long.ttft_s == pytest.approx(long_alone + short_alone)
    else:
        assert short.ttft_s > long_alone - 0.05
        assert long.ttft_s == pytest.approx(long_alone)


def test_a_turn_arriving_during_a_decode_step_joins_after_the_next_step():
    # The engine loop reads its socket between two layers only of steps with prompt tokens; a
    # turn arriving during a decode-only step is read at its end, prepared while the busy loop
    # runs the next step without it, and admitted after that one (engine/engine_loop.py).
    cache = CacheConfig(block_size=16, num_blocks=1 << 12)

    def arrivals(second_s: float) -> ConversationWorkload:
        return ConversationWorkload((Conversation(0, 0.0, 0, (Turn(100, 40, 0.0),)),
                                     Conversation(1, second_s, 1, (Turn(100, 4, 0.0),))),
                                    {0: 16, 1: 16})

    alone = simulate_fleet(arrivals(1e6), 1, "round-robin", COST, SCHED, cache)
    steps = [s for s in alone.steps if s[1] < 1e5]  # the first conversation's steps
    assert steps[0][3] > 0 and all(s[3] == 0 for s in steps[1:])  # one prompt step, then decodes
    k = 3  # the second turn arrives in the middle of the third decode step
    arrive = steps[k][1] + steps[k][2] / 2
    res = simulate_fleet(arrivals(arrive), 1, "round-robin", COST, SCHED, cache)
    second = next(r for r in res.requests if r.conv_id == 1)
    assert second.sent_s == pytest.approx(arrive)
    assert second.scheduled_s == pytest.approx(steps[k + 2][1])  # not steps[k + 1]'s start


def _profile(coefficients):
    """A startup profile (the engine's synthetic steps) of a machine with these costs."""
    plans = [build_plan(s, 16, 1 << 20) for s in DEFAULT_SHAPES]
    return [(p, sum(c * x for c, x in zip(coefficients.as_tuple(),
                                           StepFeatures.of_plan(p).raw_vector())))
            for p in plans]


def test_each_replica_plans_chunks_from_its_engines_own_startup_profile():
    # A 700-token turn arrives while another decodes: the slo floor plans its chunks from the
    # scheduler's prior. Cheap fixed costs per step make chunking look free (many chunks), a
    # dear per-op step makes it costly (few); a replica given its engine's profile plans as
    # that engine did, whatever profile seeds the others.
    cheap = _profile(StepCostCoefficients(0.002, 0.0005, 0.0008, 1e-7, 0.0, 0.0))
    dear = _profile(StepCostCoefficients(0.002, 0.0005, 0.0008, 1e-7, 0.0, 0.06))
    work = ConversationWorkload((Conversation(0, 0.0, 0, (Turn(100, 300, 0.0),)),
                                 Conversation(1, 0.5, 1, (Turn(700, 4, 0.0),))), {0: 16, 1: 16})
    cache = CacheConfig(block_size=16, num_blocks=1 << 12)

    def prompt_steps(**kw):
        res = simulate_fleet(work, 1, "round-robin", COST, SchedulerConfig(policy="slo"), cache,
                             **kw)
        return [s for s in res.steps if s[1] >= 0.5 and s[3] > 0]

    assert len(prompt_steps(calibration=cheap)) > len(prompt_steps(calibration=dear)) >= 1
    assert prompt_steps(calibration=cheap, replica_calibrations=[dear]) == \
        prompt_steps(calibration=dear)
    # A replica without a recorded profile falls back to `calibration`.
    assert prompt_steps(calibration=cheap, replica_calibrations=[None]) == \
        prompt_steps(calibration=cheap)
