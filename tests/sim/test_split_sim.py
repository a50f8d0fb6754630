"""The simulator's --core-split auto (sim/split_sim.py): two teams on a virtual clock.

With split cores the streams keep their rhythm while a document prefills beside them (its
gaps stay at a decode step on fewer cores, far below the colocated policies'), the document
pays for having fewer cores, every request finishes with its tokens; with one core the
simulation is the colocated one, step for step.
"""

from __future__ import annotations

import dataclasses

from cadence.core.config import SchedulerConfig
from cadence.executor.fake_executor import FakeExecutor
from cadence.sim.cost_model import RooflineCostModel
from cadence.sim.hardware import get_profile
from cadence.sim.metrics import summarize
from cadence.sim.model_shape import SMOLLM2_135M
from cadence.sim.simulator import simulate
from cadence.sim.workload import doc_burst

COST = RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core"))
BURST = doc_burst(num_streams=3, stream_prompt_tokens=30, stream_output_tokens=160,
                  doc_prompt_tokens=1650, doc_output_tokens=8)
# The colocated slo policy (the default before adaptive), pinned: what the split is measured against.
SLO = SchedulerConfig(policy="slo")
SPLIT = SchedulerConfig(core_split="auto")
DISJOINT = SchedulerConfig(core_split="disjoint")


def test_split_keeps_streams_steady_while_the_document_prefills_beside_them():
    colocated = summarize(simulate(BURST, SLO, COST))
    eager = summarize(simulate(BURST, SchedulerConfig(policy="eager"), COST))
    result = simulate(BURST, DISJOINT, COST, num_cores=2, contention=1.2)
    disjoint = summarize(result)
    assert all(t.num_output_tokens == spec.output_tokens
               for t, spec in zip(sorted(result.timelines.values(), key=lambda t: t.req_id),
                                  sorted(BURST.requests, key=lambda r: r.req_id)))
    # Stream gaps during the document: a decode step on one core with contention, not a chunk.
    assert disjoint.stream_max_gap_during_doc_s < colocated.stream_max_gap_during_doc_s / 2
    assert disjoint.stream_max_gap_during_doc_s < eager.stream_max_gap_during_doc_s / 10
    # The document's prefill had one core of two: slower than eager's whole machine.
    assert disjoint.doc_ttft_s > eager.doc_ttft_s
    # Overlapped (auto): the prefill keeps both cores but for the paced decode steps' share,
    # the streams keep the target's rhythm.
    overlapped = summarize(simulate(BURST, SPLIT, COST, num_cores=2, contention=1.2))
    assert overlapped.doc_ttft_s < disjoint.doc_ttft_s
    assert overlapped.stream_max_gap_during_doc_s <= SPLIT.target_itl_ms / 1000
    # Contention is in the model: more of it, slower steps on both teams.
    worse = summarize(simulate(BURST, DISJOINT, COST, num_cores=2, contention=1.6))
    assert worse.doc_ttft_s > disjoint.doc_ttft_s
    assert worse.stream_itl_p50_s > disjoint.stream_itl_p50_s
    assert "core split disjoint" in disjoint.label


def test_one_core_simulates_the_colocated_steps():
    a = simulate(BURST, SLO, COST, executor=FakeExecutor(49152))
    b = simulate(BURST, SPLIT, COST, executor=FakeExecutor(49152), num_cores=1)
    assert [dataclasses.astuple(s) for s in a.steps] == [dataclasses.astuple(s) for s in b.steps]


def test_adaptive_policy_simulates_the_split_with_the_machines_measured_contention(
        tmp_path, monkeypatch):
    from cadence.core.contention import Contention, machine_key, save_cached

    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    adaptive = SchedulerConfig(policy="adaptive")
    # Nothing measured on this machine: the core share alone, and the label says so.
    unmeasured = simulate(BURST, SPLIT, COST, num_cores=2)
    assert "unmeasured" in unmeasured.cost_model_name
    explicit = simulate(BURST, SPLIT, COST, num_cores=2, contention=1.0)
    assert [s.duration_s for s in unmeasured.steps] == [s.duration_s for s in explicit.steps]
    # A measurement cached for this machine is what the next simulation uses.
    save_cached(machine_key(2, "avx2", "m"), Contention(1.8, 1.4, num_cores=2))
    cached = simulate(BURST, SPLIT, COST, num_cores=2)
    assert "decode x1.80 prefill x1.40 (cached" in cached.cost_model_name
    a, b = summarize(unmeasured), summarize(cached)
    assert b.stream_itl_p50_s > a.stream_itl_p50_s and b.doc_ttft_s > a.doc_ttft_s
    # adaptive's default, interleave: one team, the decode steps between the chunk's layers
    # (no contention: nothing computes beside them). The streams keep their rhythm during the
    # document, which pays for the decode steps only.
    colocated = summarize(simulate(BURST, SLO, COST))
    eager = summarize(simulate(BURST, SchedulerConfig(policy="eager"), COST))
    inter = summarize(simulate(BURST, adaptive, COST, num_cores=2))
    assert inter.stream_max_gap_during_doc_s < eager.stream_max_gap_during_doc_s / 10
    assert inter.stream_max_gap_during_doc_s <= adaptive.target_itl_ms / 1000
    assert inter.stream_max_gap_during_doc_s <= colocated.stream_max_gap_during_doc_s
    assert eager.doc_ttft_s < inter.doc_ttft_s < 1.5 * eager.doc_ttft_s
    # One core: adaptive is the colocated slo policy, step for step.
    one = simulate(BURST, adaptive, COST, executor=FakeExecutor(49152), num_cores=1)
    slo = simulate(BURST, SLO, COST, executor=FakeExecutor(49152))
    assert [dataclasses.astuple(s) for s in one.steps] == [dataclasses.astuple(s) for s in slo.steps]
