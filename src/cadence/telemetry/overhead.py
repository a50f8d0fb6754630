"""Measure the recorder's cost per step: `python -m cadence.telemetry.overhead [--seqs N]`.

Feeds synthetic decode steps (N sequences, one token each) through a TelemetryRecorder, with and
without a JSONL TraceWriter listener, and prints microseconds per step. Prints numbers only; no
threshold is asserted anywhere (timings are noisy).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from cadence.core.plan import ScheduledChunk, StepOutput, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler_types import RequestUpdate
from cadence.telemetry.recorder import TelemetryRecorder
from cadence.telemetry.trace_writer import TraceWriter


def _decode_plan(step_id: int, req_ids: list[str], params: SamplingParams) -> StepPlan:
    chunks = tuple(
        ScheduledChunk(r, (1,), 100 + step_id, (0,), True, params, step_id, is_prefill=False)
        for r in req_ids
    )
    return StepPlan(step_id=step_id, chunks=chunks, block_size=16)


def measure(num_seqs: int, num_steps: int, trace_path: str | None) -> float:
    """Microseconds of recorder work per step (plan building excluded)."""
    rec = TelemetryRecorder()
    writer = TraceWriter(trace_path) if trace_path else None
    if writer:
        rec.add_listener(writer)
    req_ids = [f"r{i}" for i in range(num_seqs)]
    for r in req_ids:
        rec.request_arrived(r, 0.0, 100)
    params = SamplingParams()
    plans = [_decode_plan(s, req_ids, params) for s in range(num_steps)]
    updates = [
        [RequestUpdate(r, (5,), False, None, 100, s + 1, 0) for r in req_ids] for s in range(num_steps)
    ]
    t0 = time.perf_counter()
    for s in range(num_steps):
        rec.record_step(plans[s], StepOutput(s), updates[s], float(s), s + 0.5)
    elapsed = time.perf_counter() - t0
    rec.close()
    return elapsed / num_steps * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.jsonl")
        print(f"{'seqs/step':>10} {'recorder us/step':>17} {'+trace file us/step':>20}")
        for n in args.seqs:
            plain = measure(n, args.steps, None)
            traced = measure(n, args.steps, trace)
            print(f"{n:>10} {plain:>17.1f} {traced:>20.1f}")


if __name__ == "__main__":
    main()
