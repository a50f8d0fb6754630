"""Interference attribution on hand-built traces (known causes) and on an engine run with a
fake executor whose step cost is known (virtual clock)."""

from __future__ import annotations

import json

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.engine.llm_engine import LLMEngine
from cadence.executor.fake_executor import FakeExecutor
from cadence.telemetry.attribution import (
    CAUSE_IDLE,
    CAUSE_PREEMPTION,
    CAUSE_PREFILL,
    CAUSE_SLOW_STEP,
    InterferenceTracker,
    attribute_trace,
    token_bucket,
)
from cadence.telemetry.recorder import TelemetryRecorder
from cadence.telemetry.trace_writer import TraceWriter, read_trace

STREAMS = ("s0", "s1", "s2")


def _step(step_id, t_start, t_end, sampled, prefill=(), preempted=()):
    return {"type": "step", "step_id": step_id, "t_start": t_start, "t_end": t_end,
            "num_prefill_tokens": sum(p[1] for p in prefill),
            "num_decode_tokens": len(sampled), "req_ids": list(sampled) + [p[0] for p in prefill],
            "prefill_req_ids": [p[0] for p in prefill],
            "prefill_chunk_tokens": [p[1] for p in prefill],
            "prefill_prompt_tokens": [p[2] for p in prefill],
            "sampled_req_ids": list(sampled), "preempted_req_ids": list(preempted)}


def _hand_built_trace():
    """3 streams decode at 20 ms a step; step 10 computes a 2000-token document alone (1 s);
    step 20 is a slow decode-only step (0.5 s); stream s2 is preempted at step 30 and recomputes
    its 300-token prompt in step 32 (steps 30-32 take 50 ms); the engine idles 0.6 s before step 40."""
    steps, t = [], 0.0
    for i in range(50):
        if i == 10:
            steps.append(_step(i, t, t + 1.0, ["doc"], prefill=[("doc", 2000, 2000)]))
            t += 1.0
            continue
        if i == 40:
            t += 0.6
        dur = 0.5 if i == 20 else 0.05 if 30 <= i <= 32 else 0.02
        sampled = [s for s in STREAMS if not (s == "s2" and 30 <= i <= 31)]
        prefill = [("s2", 300, 300)] if i == 32 else []
        if i == 32:
            sampled = ["s0", "s1", "s2"]
        steps.append(_step(i, t, t + dur, sampled, prefill=prefill,
                           preempted=["s2"] if i == 30 else []))
        t += dur
    return steps


def test_hand_built_trace_every_stall_has_its_known_cause():
    att = attribute_trace(_hand_built_trace(), target_itl_s=0.1)
    by_cause = {}
    for s in att.stalls:
        by_cause.setdefault(s.cause, []).append(s)
    # The document's step stalls each stream once; doc itself has no gap there (first token).
    doc_stalls = by_cause[CAUSE_PREFILL]
    assert sorted(s.req_id for s in doc_stalls) == list(STREAMS)
    for s in doc_stalls:
        assert s.step_ids == (10, 11)  # the doc's step, then the one that made the token
        assert [(c.req_id, c.prompt_tokens, c.prefill_tokens) for c in s.causes] == [("doc", 2000, 2000)]
        assert s.gap_s == pytest.approx(1.02)
        assert s.solo_itl_s == pytest.approx(0.02)
        assert s.excess_s == pytest.approx(1.0)
    assert sorted(s.req_id for s in by_cause[CAUSE_SLOW_STEP]) == list(STREAMS)
    assert [s.req_id for s in by_cause[CAUSE_PREEMPTION]] == ["s2"]
    assert by_cause[CAUSE_PREEMPTION][0].step_ids == (30, 31, 32)
    assert sorted(s.req_id for s in by_cause[CAUSE_IDLE]) == list(STREAMS)
    assert len(att.stalls) == 10
    # Per request: each stream suffered 1 s from the doc, which caused all of it; s0 and s1
    # also lost 30 ms in step 32 to s2's recompute (under the target: no stall).
    assert att.requests["s2"].suffered_s == pytest.approx(1.0)
    assert att.requests["s0"].suffered_s == pytest.approx(1.03)
    assert att.requests["s1"].suffered_s == pytest.approx(1.03)
    assert att.requests["s2"].caused_s == pytest.approx(0.06)
    assert att.requests["doc"].caused_s == pytest.approx(3 * 1.0)
    assert att.requests["doc"].prompt_tokens == 2000
    assert att.stall_s_by_cause[CAUSE_PREFILL] == pytest.approx(3 * 1.0)


def test_split_between_two_prompts_by_their_tokens_and_gaps_under_target_not_stalls():
    steps = [_step(0, 0.0, 0.01, ["a"]), _step(1, 0.01, 0.02, ["a"]),
             _step(2, 0.02, 0.03, ["a"]), _step(3, 0.03, 0.04, ["a"]),
             _step(4, 0.04, 0.34, ["a"], prefill=[("x", 300, 900), ("y", 100, 100)])]
    att = attribute_trace(steps, target_itl_s=0.5)
    assert att.stalls == []  # 0.3 s gap is under the 0.5 s target
    assert att.requests["a"].suffered_s == pytest.approx(0.29)
    assert att.requests["x"].caused_s == pytest.approx(0.29 * 0.75)
    assert att.requests["y"].caused_s == pytest.approx(0.29 * 0.25)
    att = attribute_trace(steps, target_itl_s=0.1)
    (stall,) = att.stalls
    assert [c.req_id for c in stall.causes] == ["x", "y"]  # most prompt tokens first
    assert stall.causes[0].prompt_tokens == 900


def test_old_traces_without_sampled_ids_use_request_token_times():
    steps = _hand_built_trace()[:15]
    tokens = {}
    for s in steps:
        for r in s.pop("sampled_req_ids"):
            tokens.setdefault(r, []).append(s["t_end"])
        for key in ("preempted_req_ids",):
            s.pop(key)
    requests = [{"type": "request", "req_id": r, "token_times": t, "num_prompt_tokens": 10}
                for r, t in tokens.items()]
    att = attribute_trace(steps + requests, target_itl_s=0.1)
    assert sorted(s.req_id for s in att.stalls) == list(STREAMS)
    assert all(s.causes[0].req_id == "doc" for s in att.stalls)


def test_tracker_state_is_bounded():
    tracker = InterferenceTracker(0.05, max_steps=8, max_stalls=4, max_requests=16)
    t = 0.0
    for i in range(200):
        rid = f"r{i % 40}"
        tracker.add_step(_step(i, t, t + 0.1, [rid]))
        t += 0.1
    assert len(tracker._steps) == 8 and len(tracker.stalls) == 4
    assert len(tracker.interference()) <= 16


def test_token_buckets():
    assert [token_bucket(n) for n in (0, 1, 64, 65, 1024, 2000, 5000)] == [
        "0", "1-64", "1-64", "65-256", "257-1024", "1025-4096", ">4096"]


class _TimedFake(FakeExecutor):
    """FakeExecutor on a virtual clock: a step costs 10 ms + 1 ms per prompt token."""

    def __init__(self, clock):
        super().__init__(vocab_size=500)
        self.clock = clock

    def execute(self, plan):
        self.clock[0] += 0.010 + 0.001 * plan.num_prefill_tokens
        return super().execute(plan)


@pytest.mark.parametrize("policy", ["eager", "chunked"])
def test_engine_run_stalls_are_the_documents_prefill(tmp_path, policy):
    """Real scheduler, engine loop, recorder and trace writer; step cost known: every stall
    over the target is the document's prefill (eager: one; chunked 64: none over target)."""
    clock = [0.0]
    sched = Scheduler(SchedulerConfig(policy=policy, max_num_batched_tokens=64, max_num_seqs=8,
                                      max_model_len=4096),
                      CacheConfig(block_size=16, num_blocks=512))
    telemetry = TelemetryRecorder()
    path = tmp_path / "trace.jsonl"
    telemetry.add_listener(TraceWriter(path, stall_target_s=0.1))
    engine = LLMEngine.from_parts(sched, _TimedFake(clock), None, telemetry=telemetry,
                                  clock=lambda: clock[0])
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"s{i}", [5 + i] * 20, params)
    for _ in range(8):
        engine.step()
    engine.add_request("doc", list(range(3, 803)), SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.close()
    records = list(read_trace(path))
    written = [{k: v for k, v in r.items() if k != "type"} for r in records if r["type"] == "stall"]
    att = attribute_trace(records, target_itl_s=0.1)
    assert [s.to_dict() for s in att.stalls] == written  # live (writer) == replay
    if policy == "eager":
        assert sorted(s.req_id for s in att.stalls) == ["s0", "s1", "s2"]
        for s in att.stalls:
            assert s.cause == CAUSE_PREFILL
            assert [(c.req_id, c.prompt_tokens) for c in s.causes] == [("doc", 800)]
        assert att.requests["doc"].caused_s > 3 * 0.7
    else:
        assert att.stalls == []
        assert att.requests["doc"].caused_s > 0  # 64-token chunks still slow steps down a bit
    inter = {r["req_id"]: r for r in records if r["type"] == "interference"}
    assert inter["doc"]["caused_s"] == pytest.approx(att.requests["doc"].caused_s)
    meta = records[0]
    assert meta["type"] == "meta" and meta["target_itl_s"] == 0.1
    json.dumps(records)
