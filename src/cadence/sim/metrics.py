"""What a simulated run is judged by, from the engine's own RequestTimeline formulas
(cadence.telemetry.request_timeline: TTFT = first token - arrival; ITL = every gap between
consecutive output tokens of one request, pooled over requests; each simulated step emits one
token per request, so there are no zero gaps).

The doc-burst question is answered by `stream_max_gap_during_doc_s`: the longest gap of any
stream that overlaps the document's prefill window [first scheduled, first token]. Under eager
it is about the whole prefill time; chunking bounds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.sim.simulator import SimResult
from cadence.sim.workload import DOCUMENT, STREAM


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (as
    numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class SimSummary:
    label: str
    policy: str
    max_num_batched_tokens: int
    target_itl_ms: float | None
    num_steps: int
    doc_ttft_s: float | None
    doc_prefill_s: float | None
    stream_max_gap_during_doc_s: float | None
    stream_itl_p50_s: float | None
    stream_itl_p99_s: float | None
    stream_itl_max_s: float | None
    output_tokens_per_s: float
    makespan_s: float
    # slo only: decode-carrying steps whose simulated time exceeded the target, and those
    # whose *predicted* time did (other than the one-block minimum chunk).
    decode_steps_over_target: int | None = None
    decode_steps_predicted_over_target: int | None = None
    num_decode_steps: int = 0


def summarize(result: SimResult, label: str | None = None) -> SimSummary:
    sched = result.sched
    timelines = result.timelines
    docs = [t for t in timelines.values() if result.kind_of(t.req_id) == DOCUMENT]
    streams = [t for t in timelines.values() if result.kind_of(t.req_id) == STREAM]
    doc = docs[0] if docs else None
    window = None
    if doc is not None and doc.prefill_time is not None:
        window = (doc.first_scheduled_time, doc.first_token_time)
    stream_itl = [gap for t in streams for gap in t.itl]
    max_gap = None
    if window is not None:
        overlapping = [
            b - a
            for t in streams
            for a, b in zip(t.token_times, t.token_times[1:])
            if b > window[0] and a < window[1]
        ]
        max_gap = max(overlapping, default=None)
    total_out = sum(t.num_output_tokens for t in timelines.values())
    makespan = result.makespan_s
    decode_steps = [s for s in result.steps if s.num_decode_tokens > 0]
    over = predicted_over = None
    target = sched.target_itl_ms / 1000.0 if sched.models_step_time else None
    if target is not None:
        over = sum(1 for s in decode_steps if s.duration_s > target)
        predicted_over = sum(
            1
            for s in decode_steps
            if s.predicted_s is not None
            and s.predicted_s > target + 1e-12
            and s.num_prefill_tokens > result.cache.block_size
        )
    return SimSummary(
        label=label or describe(result),
        policy=sched.policy,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        target_itl_ms=sched.target_itl_ms if sched.models_step_time else None,
        num_steps=len(result.steps),
        doc_ttft_s=doc.ttft if doc is not None else None,
        doc_prefill_s=doc.prefill_time if doc is not None else None,
        stream_max_gap_during_doc_s=max_gap,
        stream_itl_p50_s=percentile(stream_itl, 50),
        stream_itl_p99_s=percentile(stream_itl, 99),
        stream_itl_max_s=max(stream_itl, default=None),
        output_tokens_per_s=total_out / makespan if makespan > 0 else 0.0,
        makespan_s=makespan,
        decode_steps_over_target=over,
        decode_steps_predicted_over_target=predicted_over,
        num_decode_steps=len(decode_steps),
    )


def describe(result: SimResult) -> str:
    s = result.sched
    split = f" + core split {s.core_split}" if s.core_split != "off" else ""
    if s.models_step_time:
        return f"{s.policy} {s.target_itl_ms:g} ms (budget {s.max_num_batched_tokens}){split}"
    return f"{s.policy} (budget {s.max_num_batched_tokens})"
