"""Replicas sharing a host's cores with the serving stack (cadence.sim.host_cpu, sim/fleet.py)."""

from __future__ import annotations

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.conversations import Conversation, ConversationWorkload, Turn, synthetic
from cadence.sim.cost_model import RooflineCostModel
from cadence.sim.fleet import simulate_fleet
from cadence.sim.hardware import get_profile
from cadence.sim.host_cpu import HostCpu, host_from_run
from cadence.sim.model_shape import SMOLLM2_135M

COST = RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core"))
SCHED = SchedulerConfig(policy="chunked")


def _run(workload, n, policy="round-robin", host=None):
    return simulate_fleet(workload, n, policy, COST, SCHED,
                          CacheConfig(block_size=16, num_blocks=1 << 14), hop_s=0.01, host=host)


def test_threads_share_the_cores_once_they_outnumber_them():
    host = HostCpu(cores=2, idle_cores=0.5)
    assert host.rate(1, 0) == 1.0  # 1.5 runnable on 2 cores
    assert host.rate(2, 0) == pytest.approx(2 / 2.5)
    assert host.rate(2, 2) == pytest.approx(2 / 4.5)
    assert HostCpu(cores=2, threads_per_replica=2).rate(2, 0) == pytest.approx(0.5)
    # Co-running replicas: the slowdown applies as far as the other cores compute steps too.
    corun = HostCpu(cores=2, corun_slowdown=1.2)
    assert corun.engine_rate(1, 0) == 1.0
    assert corun.engine_rate(2, 0) == pytest.approx(1 / 1.2)
    assert corun.engine_rate(4, 0) == pytest.approx(0.5 / 1.2)
    assert corun.rate(2, 0) == 1.0  # the stack's own work is not slowed by it
    assert HostCpu(cores=4, corun_slowdown=1.3).engine_rate(2, 0) == pytest.approx(1 / 1.1)
    # Below 1: steps beside each other ran faster than processor sharing with the stack
    # gives them (its CPU fell between their steps); the factor undoes that much of the share.
    faster = HostCpu(cores=2, idle_cores=0.2, corun_slowdown=0.9)
    assert faster.engine_rate(2, 0) == pytest.approx(2 / 2.2 / 0.9)
    with pytest.raises(ValueError):
        HostCpu(cores=2, corun_slowdown=0.0)
    with pytest.raises(ValueError):
        HostCpu(cores=0)
    with pytest.raises(ValueError):
        HostCpu(cores=2, cpu_per_token_s=-1.0)


def test_a_host_with_a_core_per_replica_and_no_stack_changes_nothing():
    w = synthetic(num_conversations=6, rate=2.0, doc_tokens=100, seed=3)
    alone, shared = _run(w, 2), _run(w, 2, host=HostCpu(cores=2))
    assert [(r.req_id, r.replica, r.ttft_s, r.finished_s) for r in alone.requests] == \
        [(r.req_id, r.replica, r.ttft_s, r.finished_s) for r in shared.requests]


def test_replicas_on_one_core_take_turns_and_only_while_both_compute():
    one = ConversationWorkload((Conversation(0, 0.0, 0, (Turn(400, 8, 0.0),)),), {0: 50})
    # One request: the other replica idles, so the shared core is all its own.
    alone, shared = _run(one, 2), _run(one, 2, host=HostCpu(cores=1))
    assert shared.requests[0].ttft_s == pytest.approx(alone.requests[0].ttft_s)
    # Two at once on two replicas: each prefill runs at half speed on the one core.
    two = ConversationWorkload(tuple(Conversation(c, 0.0, 0, (Turn(400, 8, 0.0),))
                                     for c in range(2)), {0: 50})
    alone, shared = _run(two, 2), _run(two, 2, host=HostCpu(cores=1))
    assert sorted(r.replica for r in alone.requests) == [0, 1]
    for a, s in zip(alone.requests, shared.requests):
        assert s.ttft_s - 0.01 == pytest.approx(2 * (a.ttft_s - 0.01), rel=1e-6)
    # The stack's CPU slows them further; every step's wall time is what the engine observes.
    busy = _run(two, 2, host=HostCpu(cores=1, cpu_per_request_s=0.05, cpu_per_token_s=0.002))
    assert all(b.ttft_s > s.ttft_s for b, s in zip(busy.requests, shared.requests))
    assert sum(s[2] for s in busy.steps) > sum(s[2] for s in shared.steps)


def test_the_runs_pace_and_corun_slowdown_come_from_its_traced_steps():
    from cadence.core.step_cost import StepFeatures
    from cadence.core.step_profile import ProfileShape, build_plan
    from cadence.sim.calibration import cost_model_from_samples
    from cadence.sim.run_speed import PacedCostModel, measure_run_speed

    shapes = [ProfileShape(decodes=d, decode_ctx=c) for d in (1, 4, 8) for c in (64, 256)] + [
        ProfileShape(chunk=n, chunk_start=s) for n in (64, 128, 256, 512) for s in (0, 256)]
    samples = [(build_plan(sh, 16, 1 << 20), 0.004 + 0.00002 * sh.decodes * sh.decode_ctx
                + 0.001 * sh.chunk) for sh in shapes]
    cost = cost_model_from_samples(samples)
    sample = []
    for i in range(60):  # decode steps alone at 1.1x the price, beside another's at 1.3x
        f = StepFeatures.of_chunk(100 + 10 * i, 1, False) + StepFeatures.of_chunk(300, 1, False)
        price = cost.features_time(f, 2)
        sample.append([1.1 * price, 0, 2, f.attention_pairs, 0, 2, 0.0])
        sample.append([1.3 * price, 0, 2, f.attention_pairs, 0, 2, 0.95])
        sample.append([5.0 * price, 0, 2, f.attention_pairs, 0, 2, 0.5])  # partly: not used
    speed = measure_run_speed(sample, cost)
    assert speed.alone == pytest.approx(1.1) and speed.together == pytest.approx(1.3)
    assert speed.prompt_together is None and speed.prompt_pace == speed.alone
    host = HostCpu(cores=2, idle_cores=0.2)  # two busy replicas get 2 / 2.2 of a core each
    assert speed.corun_slowdown(host) == pytest.approx(1.3 / 1.1 * 2 / 2.2)
    # Simulated beside each other, steps take what the traced ones did (1.3 / 1.1 of alone).
    corun = HostCpu(cores=2, idle_cores=0.2, corun_slowdown=speed.corun_slowdown(host))
    assert 1 / corun.engine_rate(2, 0) == pytest.approx(1.3 / 1.1)
    assert measure_run_speed(sample[:30], cost) is None  # too few steps of each kind
    plan = samples[0][0]
    paced = PacedCostModel(cost, 1.1, 0.002)
    assert paced.step_time(plan) == pytest.approx(1.1 * cost.step_time(plan) + 0.002)
    # Prompt steps (the per-op path) beside another replica's at 1.04x their price, where the
    # decodes ran 1.3x: they take the decodes' pace times 0.8.
    for i in range(40):
        f = StepFeatures.of_chunk(64 * i, 200, True)
        sample.append([1.04 * cost.features_time(f, 1), 200, 0, f.attention_pairs, 1, 1, 1.0])
    speed = measure_run_speed(sample, cost)
    assert speed.alone == pytest.approx(1.1) and speed.together == pytest.approx(1.3)
    assert speed.prompt_pace == pytest.approx(1.1 * 1.04 / 1.3)
    prompt_plan = next(p for p, _ in samples if StepFeatures.of_plan(p).prompt_step)
    paced = PacedCostModel(cost, 1.1, 0.002, speed.prompt_pace)
    assert paced.step_time(prompt_plan) == pytest.approx(
        0.88 * cost.step_time(prompt_plan) + 0.002)
    assert paced.step_time(plan) == pytest.approx(1.1 * cost.step_time(plan) + 0.002)


def test_the_stack_cpu_is_fitted_from_a_runs_samples():
    # A run's CPU samples made from known costs: 0.05 cores steady, 20 ms per request sent,
    # 0.5 ms per token streamed (tokens spread between first token and end).
    records = [{"sent": 1.0 + 2.0 * i, "ttft": 0.3, "e2e": 1.5, "output_tokens": 40 + 5 * (i % 3)}
               for i in range(10)]
    times = [0.25 * k for k in range(100)]

    def others_at(t):
        cpu = 0.05 * t
        for r in records:
            cpu += 0.02 if r["sent"] < t else 0.0
            first, end = r["sent"] + r["ttft"], r["sent"] + r["e2e"]
            cpu += 0.0005 * r["output_tokens"] * min(1.0, max(0.0, t - first) / (end - first))
        return cpu

    row = {"replicas": 2, "cores": 2, "records": records,
           "cpu_samples": [[t, {"engine_loop": 3.0 * t, "front_end": others_at(t) * 0.6,
                                "router": others_at(t) * 0.4}] for t in times]}
    host = host_from_run(row)
    assert host.cores == 2 and host.threads_per_replica == 1
    assert host.idle_cores == pytest.approx(0.05, rel=0.05)
    assert host.cpu_per_request_s == pytest.approx(0.02, rel=0.1)
    assert host.cpu_per_token_s == pytest.approx(0.0005, rel=0.05)
    assert host_from_run({"replicas": 2, "records": records}) is None
