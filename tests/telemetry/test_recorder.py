"""TelemetryRecorder, RequestTimeline metrics, StepRecord and the JSONL trace writer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cadence.core.plan import ScheduledChunk, StepOutput, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler_types import RequestUpdate
from cadence.telemetry.recorder import TelemetryListener, TelemetryRecorder
from cadence.telemetry.request_timeline import RequestTimeline
from cadence.telemetry.trace_writer import TraceWriter, read_trace


def Update(req_id, new_token_ids, finished, finish_reason, prompt, output, cached):
    return RequestUpdate(req_id, new_token_ids, finished, finish_reason, prompt, output, cached)


@dataclass(frozen=True)
class Stats:
    num_running: int = 1
    num_waiting: int = 0
    num_blocks_total: int = 10
    num_blocks_used: int = 3
    num_blocks_free: int = 7
    num_blocks_cached: int = 2


def plan_of(step_id: int, *chunks: tuple[str, int, bool], preempted=()) -> StepPlan:
    """chunks: (req_id, num_new_tokens, is_prefill)."""
    return StepPlan(
        step_id=step_id,
        chunks=tuple(
            ScheduledChunk(
                req_id=r,
                token_ids=(0,) * n,
                start_pos=0,
                block_table=(0,),
                sample=True,
                sampling=SamplingParams(),
                output_index=0,
                is_prefill=p,
            )
            for r, n, p in chunks
        ),
        block_size=16,
        preempted=tuple(preempted),
    )


class Collect(TelemetryListener):
    def __init__(self):
        self.steps, self.finished, self.closed = [], [], False

    def on_step(self, record):
        self.steps.append(record)

    def on_request_finished(self, timeline):
        self.finished.append(timeline)

    def close(self):
        self.closed = True


def run_two_requests(rec: TelemetryRecorder) -> None:
    """a: 4-token prompt, 3 output tokens (length); b: arrives later, aborted by the engine."""
    rec.request_arrived("a", 0.0, 4)
    rec.request_arrived("b", 0.5, 2)
    rec.record_step(
        plan_of(0, ("a", 4, True)), StepOutput(0, forward_time_s=0.2),
        [Update("a", (7,), False, None, 4, 1, 0)], 1.0, 1.5, Stats(),
    )
    rec.record_step(
        plan_of(1, ("a", 1, False), ("b", 2, True)), StepOutput(1, forward_time_s=0.1),
        [Update("a", (8,), False, None, 4, 2, 0), Update("b", (9,), False, None, 2, 1, 0)],
        2.0, 2.25, Stats(),
    )
    rec.finish_request("b", "abort", 2.5)
    rec.record_step(
        plan_of(2, ("a", 1, False)), StepOutput(2),
        [Update("a", (10,), True, "length", 4, 3, 0),
         Update("b", (), True, "abort", 2, 1, 0)],  # late final update: ignored
        3.0, 3.5, Stats(),
    )


def test_timeline_metrics_follow_design_formulas():
    rec = TelemetryRecorder()
    run_two_requests(rec)
    a = rec.timeline("a")
    assert a.finished and a.finish_reason == "length"
    assert a.queue_time == pytest.approx(1.0)       # first scheduled 1.0 - arrival 0.0
    assert a.prefill_time == pytest.approx(0.5)     # first token 1.5 - first scheduled 1.0
    assert a.ttft == pytest.approx(1.5)
    assert a.token_times == [1.5, 2.25, 3.5]
    assert a.itl == pytest.approx([0.75, 1.25])
    assert a.e2e == pytest.approx(3.5)
    assert a.tpot == pytest.approx((3.5 - 1.5) / 2)
    assert a.num_output_tokens == 3 and a.num_prompt_tokens == 4

    b = rec.timeline("b")
    assert b.finish_reason == "abort" and b.finished_time == 2.5
    assert b.num_output_tokens == 1 and b.tpot is None
    assert rec.num_live == 0 and rec.num_finished_total == 2


def test_step_records_and_listeners():
    rec = TelemetryRecorder()
    seen = Collect()
    rec.add_listener(seen)
    run_two_requests(rec)
    assert [s.step_id for s in seen.steps] == [0, 1, 2]
    s1 = seen.steps[1]
    assert (s1.num_prefill_tokens, s1.num_decode_tokens, s1.num_seqs) == (2, 1, 2)
    assert s1.req_ids == ("a", "b") and s1.forward_time_s == 0.1
    assert (s1.num_blocks_used, s1.num_blocks_free, s1.num_blocks_cached) == (3, 7, 2)
    assert s1.duration_s == pytest.approx(0.25)
    assert [t.req_id for t in seen.finished] == ["b", "a"]
    rec.close()
    assert seen.closed


def test_preemptions_are_counted_per_request():
    rec = TelemetryRecorder()
    rec.request_arrived("a", 0.0, 3)
    record = rec.record_step(plan_of(0, ("x", 1, False), preempted=["a"]), None, [], 0.0, 0.1)
    assert record.num_preemptions == 1
    assert rec.timeline("a").num_preemptions == 1
    assert rec.timeline("a").first_scheduled_time is None


def test_memory_is_bounded():
    rec = TelemetryRecorder(max_steps=5, max_finished=3)
    for i in range(20):
        rid = f"r{i}"
        rec.request_arrived(rid, float(i), 1)
        rec.record_step(
            plan_of(i, (rid, 1, True)), None, [Update(rid, (1,), True, "stop", 1, 1, 0)],
            float(i), float(i) + 0.5,
        )
    assert len(rec.steps) == 5 and rec.steps[0].step_id == 15
    assert [t.req_id for t in rec.finished_timelines()] == ["r17", "r18", "r19"]
    assert rec.timeline("r0") is None and rec.num_steps_total == 20


def test_broken_listener_does_not_stop_recording(caplog):
    class Broken(TelemetryListener):
        def on_step(self, record):
            raise RuntimeError("boom")

    rec = TelemetryRecorder()
    rec.add_listener(Broken())
    rec.record_step(plan_of(0, ("a", 1, True)), None, [], 0.0, 1.0)
    assert rec.num_steps_total == 1
    assert "listener" in caplog.text


def test_unfinished_timeline_metrics_are_none():
    t = RequestTimeline("x", arrival_time=1.0)
    assert t.ttft is None and t.e2e is None and t.tpot is None and t.itl == []
    assert t.to_dict()["ttft"] is None


def test_trace_writer_round_trip(tmp_path):
    path = tmp_path / "trace.jsonl"
    rec = TelemetryRecorder()
    with TraceWriter(path, flush_every=2) as writer:
        rec.add_listener(writer)
        run_two_requests(rec)
    records = list(read_trace(path))
    assert [r["type"] for r in records].count("step") == 3
    reqs = {r["req_id"]: r for r in records if r["type"] == "request"}
    assert reqs["a"]["ttft"] == pytest.approx(1.5) and reqs["b"]["finish_reason"] == "abort"
    step = next(r for r in records if r["type"] == "step" and r["step_id"] == 1)
    assert step["req_ids"] == ["a", "b"]


def test_trace_writer_bad_path_is_clear(tmp_path):
    with pytest.raises(ValueError, match="cannot open trace file"):
        TraceWriter(tmp_path / "missing-dir" / "t.jsonl")
