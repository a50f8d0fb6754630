"""The diagnosis of a recording: is there prefill/decode interference, how much, which prompt
lengths cause it, TTFT by prompt bucket, queue vs prefill time.

With engine steps (a trace, a server) stalls are attributed exactly, step by step
(cadence.telemetry.attribution). From client times alone (a bench result) a gap is blamed on the
other requests whose prefill window (sent -> first token) overlapped it, split by prompt
length: coarser, and said so in the report.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from cadence.diagnose.recording import Recording, RequestRec
from cadence.sim.metrics import percentile
from cadence.telemetry.attribution import (
    CAUSE_PREFILL,
    CAUSE_SLOW_STEP,
    CAUSES,
    InterferenceTracker,
    RequestInterference,
    Stall,
    StallCause,
    TOKEN_BUCKETS,
    GapWindow,
    token_bucket,
)

DEFAULT_TARGET_ITL_S = 0.1


@dataclass
class Diagnosis:
    recording: Recording
    target_itl_s: float
    exact: bool  # step-level attribution (engine steps) vs overlapping windows (client times)
    stalls: list[Stall]
    requests: dict[str, RequestInterference]
    stall_s_by_cause: dict[str, float]
    solo_itl_s: float | None
    # prompt bucket -> seconds of stream time its prompts caused
    caused_by_bucket: dict[str, float] = field(default_factory=dict)
    # the requests that caused most, biggest first: (req_id, prompt tokens, seconds caused)
    top_causes: list[tuple[str, int, float]] = field(default_factory=list)
    buckets: list[dict[str, Any]] = field(default_factory=list)

    @property
    def prefill_stalls(self) -> list[Stall]:
        return [s for s in self.stalls if s.cause == CAUSE_PREFILL]

    @property
    def interference_present(self) -> bool:
        return bool(self.prefill_stalls)

    @property
    def total_caused_s(self) -> float:
        return sum(r.caused_s for r in self.requests.values())

    @property
    def decode_time_s(self) -> float:
        return sum(sum(r.gaps) for r in self.recording.requests)

    @property
    def cause_prompt_tokens(self) -> list[int]:
        """Prompt lengths of the requests that caused at least 10% of all interference."""
        total = self.total_caused_s
        return sorted({p for _, p, s in self.top_causes if total and s >= 0.1 * total},
                      reverse=True)


def diagnose(rec: Recording, target_itl_s: float | None = None) -> Diagnosis:
    target = target_itl_s or rec.target_itl_s or DEFAULT_TARGET_ITL_S
    if rec.steps:
        tracker = _replay_steps(rec, target)
        exact = True
    else:
        tracker = _overlap_attribution(rec.requests, target)
        exact = False
    stalls = list(tracker.stalls)
    info = {r.req_id: r for r in tracker.interference()}
    for r in rec.requests:
        entry = info.setdefault(r.req_id, RequestInterference(r.req_id))
        entry.prompt_tokens = r.prompt_tokens or entry.prompt_tokens
    caused_by_bucket: dict[str, float] = {}
    for r in info.values():
        if r.caused_s > 0:
            b = token_bucket(r.prompt_tokens)
            caused_by_bucket[b] = caused_by_bucket.get(b, 0.0) + r.caused_s
    top = sorted(((r.req_id, r.prompt_tokens, r.caused_s) for r in info.values() if r.caused_s > 0),
                 key=lambda x: -x[2])
    return Diagnosis(rec, target, exact, stalls, info, dict(tracker.stall_s_by_cause),
                     tracker.solo_itl_s(), caused_by_bucket, top[:10],
                     bucket_table(rec.requests))


def _replay_steps(rec: Recording, target: float) -> InterferenceTracker:
    steps = sorted(rec.steps, key=lambda s: (s["t_end"], s["step_id"]))
    if not any(s.get("sampled_req_ids") for s in steps):
        by_end: dict[float, list[str]] = {}
        for r in rec.requests:
            for t in r.token_times:
                by_end.setdefault(t, []).append(r.req_id)
        steps = [dict(s, sampled_req_ids=by_end.get(s["t_end"], [])) for s in steps]
    n = max(1, len(steps))
    tracker = InterferenceTracker(target, max_steps=n, max_stalls=n * 64,
                                  max_requests=len(rec.requests) + n)
    for s in steps:
        tracker.add_step(s)
    return tracker


def _overlap_attribution(requests: list[RequestRec], target: float) -> InterferenceTracker:
    """Client times only: each token is a zero-length pseudo step; a gap's causes are the
    other requests whose window [sent, first token] intersects it."""
    windows = [(r.req_id, r.prompt_tokens, r.arrival, r.first_token) for r in requests
               if r.first_token is not None]
    tokens = sorted((t, r.req_id) for r in requests for t in r.token_times)
    tracker = _OverlapTracker(target, windows, max_steps=16, max_stalls=max(1, len(tokens)),
                              max_requests=len(requests) + 1)
    for i, (t, rid) in enumerate(tokens):
        tracker.add_step({"step_id": i, "t_start": t, "t_end": t, "sampled_req_ids": [rid]})
    return tracker


class _OverlapTracker(InterferenceTracker):
    def __init__(self, target: float, windows: list[tuple[str, int, float, float]],
                 **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._prefill_windows = windows

    def _window(self, req_id: str, t_prev: float, t_token: float) -> GapWindow:
        w = GapWindow(covered_s=t_token - t_prev)  # client times: no idle detection
        for rid, prompt, start, end in self._prefill_windows:
            if rid != req_id and start < t_token and end > t_prev:
                w.causes[rid] = [prompt, prompt]
        return w


def bucket_table(requests: list[RequestRec]) -> list[dict[str, Any]]:
    """TTFT, queue and prefill time by prompt-length bucket."""
    rows = []
    for b in TOKEN_BUCKETS:
        members = [r for r in requests if token_bucket(r.prompt_tokens) == b]
        if not members:
            continue
        ttft = [r.ttft for r in members if r.ttft is not None]
        queue = [r.queue_time for r in members if r.queue_time is not None]
        prefill = [r.prefill_time for r in members if r.prefill_time is not None]
        rows.append({
            "bucket": b, "count": len(members),
            "ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95),
            "ttft_max": max(ttft) if ttft else None,
            "queue_p50": percentile(queue, 50), "prefill_p50": percentile(prefill, 50),
            "queue_mean": statistics.fmean(queue) if queue else None,
            "prefill_mean": statistics.fmean(prefill) if prefill else None,
        })
    return rows


def stall_summary(d: Diagnosis) -> dict[str, Any]:
    gaps = [g for r in d.recording.requests for g in r.gaps]
    prefill = d.prefill_stalls
    return {
        "num_gaps": len(gaps),
        "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
        "max_gap_s": max(gaps) if gaps else None,
        "num_stalls": len(d.stalls),
        "num_stalls_by_cause": {c: sum(1 for s in d.stalls if s.cause == c) for c in CAUSES},
        "prefill_stall_max_s": max((s.gap_s for s in prefill), default=None),
        "streams_stalled_by_prefill": len({s.req_id for s in prefill}),
        "interference_s": d.total_caused_s,
        "interference_share": d.total_caused_s / d.decode_time_s if d.decode_time_s else 0.0,
        "slow_step_stalls": sum(1 for s in d.stalls if s.cause == CAUSE_SLOW_STEP),
    }


__all__ = ["Diagnosis", "StallCause", "bucket_table", "diagnose", "stall_summary"]
