"""Latency and throughput formulas (docs: docs/ARCHITECTURE.md, "Telemetry and metrics").

All per-request times are client-side, from the request's send time:
- TTFT = time of the first chunk carrying a token - send time.
- ITL = every gap between consecutive output tokens of a request, the first token excluded,
  pooled over requests. A chunk carrying k tokens was sent together by the server (we only know
  k > 1 when the server says so in logprobs.tokens), so it counts as one gap and k - 1 zero gaps.
- TPOT = (E2E - TTFT) / (output tokens - 1), output tokens from the server's usage when sent.
- E2E = stream end (`[DONE]` or close) - send time.
- Throughput = successful requests (and their output tokens) / run duration; goodput = successful
  requests meeting every SLO / run duration. Latency statistics use successful requests only;
  failed ones are listed with their reasons.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cadence.bench.config import AnalysisConfig, SLOConfig
from cadence.bench.records import RequestRecord

ITL_COUNTING = (
    "ITL = gaps between consecutive output tokens, first token excluded, pooled over successful "
    "requests; a chunk carrying k tokens (k known from logprobs.tokens, else 1 per text chunk) "
    "counts as one gap and k-1 zero gaps, because the server sent those tokens together."
)


def token_times(rec: RequestRecord) -> list[float]:
    """Arrival time of each output token seen: a chunk of k tokens gives k equal times."""
    out: list[float] = []
    for t, k in zip(rec.chunk_times, rec.chunk_tokens):
        out.extend([t] * k)
    return out


def ttft(rec: RequestRecord) -> float | None:
    first = rec.first_token_time
    return None if first is None else first - rec.send_time


def e2e(rec: RequestRecord) -> float | None:
    return None if rec.end_time is None else rec.end_time - rec.send_time


def itl_gaps(rec: RequestRecord) -> list[float]:
    """Every inter-token gap of one request (len = tokens seen - 1)."""
    times = token_times(rec)
    return [b - a for a, b in zip(times, times[1:])]


def tpot(rec: RequestRecord) -> float | None:
    first, total = ttft(rec), e2e(rec)
    n = rec.output_tokens
    if first is None or total is None or n < 2:
        return None
    return (total - first) / (n - 1)


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """count, mean, min, p50, p95, p99, max (linear-interpolated percentiles); None when empty."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {
        "count": int(arr.size),
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(arr.max()),
    }


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi - 1}" if hi is not None else f">={lo}"


def ttft_by_bucket(records: Sequence[RequestRecord], edges: Sequence[int]) -> list[dict[str, Any]]:
    """TTFT statistics per prompt-length bucket [lo, hi); `edges` are the upper bounds."""
    bounds = list(zip([0, *edges], [*edges, None]))
    out = []
    for lo, hi in bounds:
        vals = [
            ttft(r)
            for r in records
            if r.ok and r.prompt_tokens >= lo and (hi is None or r.prompt_tokens < hi) and ttft(r) is not None
        ]
        out.append({"bucket": bucket_label(lo, hi), "lo": lo, "hi": hi, "ttft": summarize(vals)})
    return out


def meets_slo(rec: RequestRecord, slo: SLOConfig) -> dict[str, bool]:
    """Per SLO that is set: does this (successful) request meet it? ITL: its largest gap."""
    checks: dict[str, bool] = {}
    limits = slo.limits()
    if "ttft" in limits:
        v = ttft(rec)
        checks["ttft"] = v is not None and v <= limits["ttft"]
    if "itl" in limits:
        gaps = itl_gaps(rec)
        checks["itl"] = (max(gaps) if gaps else 0.0) <= limits["itl"]
    if "tpot" in limits:
        v = tpot(rec)
        checks["tpot"] = v is None or v <= limits["tpot"]  # a 1-token answer has no TPOT
    if "e2e" in limits:
        v = e2e(rec)
        checks["e2e"] = v is not None and v <= limits["e2e"]
    return checks


def goodput(records: Sequence[RequestRecord], slo: SLOConfig, duration_s: float) -> dict[str, Any]:
    """Requests/s meeting every SLO, plus how many met each one."""
    ok = [r for r in records if r.ok]
    per_request = [meets_slo(r, slo) for r in ok]
    good = sum(1 for checks in per_request if all(checks.values()))
    met = {k: sum(1 for c in per_request if c.get(k)) for k in slo.limits()}
    return {
        "slo": slo.limits(),
        "itl_rule": "a request meets itl when its largest inter-token gap is within the limit",
        "good_requests": good,
        "total_requests": len(records),
        "goodput_rps": good / duration_s if duration_s > 0 else 0.0,
        "fraction": good / len(records) if records else 0.0,
        "met_per_slo": met,
    }


def throughput(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    d = duration_s if duration_s > 0 else float("nan")
    return {
        "duration_s": duration_s,
        "completed": len(ok),
        "request_rps": len(ok) / d if duration_s > 0 else 0.0,
        "output_tokens": out_tokens,
        "output_tps": out_tokens / d if duration_s > 0 else 0.0,
        "prompt_tokens": in_tokens,
        "prompt_tps": in_tokens / d if duration_s > 0 else 0.0,
    }


def failures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    failed = [r for r in records if not r.ok]
    return {
        "count": len(failed),
        "by_kind": dict(Counter(r.failure.kind for r in failed if r.failure)),
        "requests": [
            {
                "index": r.index,
                "kind": r.failure.kind if r.failure else "unknown",
                "http_status": r.failure.http_status if r.failure else None,
                "message": r.failure.message if r.failure else "",
                "tokens_received": r.observed_tokens,
            }
            for r in failed
        ],
    }


def token_counting(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """How tokens were counted, and where the server's usage disagrees with what was seen."""
    chunks = sum(len(r.chunk_tokens) for r in records)
    multi = sum(1 for r in records for k in r.chunk_tokens if k > 1)
    mismatched = [
        r.index
        for r in records
        if r.ok and r.usage_completion_tokens is not None and r.usage_completion_tokens != r.observed_tokens
    ]
    prompt_mismatch = [
        r.index for r in records if r.usage_prompt_tokens is not None and r.usage_prompt_tokens != r.prompt_tokens
    ]
    return {
        "rule": ITL_COUNTING,
        "chunks": chunks,
        "multi_token_chunks": multi,
        "by_logprobs": sum(1 for r in records if r.counted_by_logprobs),
        "usage_reported": sum(1 for r in records if r.usage_completion_tokens is not None),
        "usage_mismatch_requests": mismatched,
        # Requests whose server-counted prompt length differs from the client's count (a
        # different tokenizer, or a BOS the server adds).
        "prompt_tokens_mismatch_requests": prompt_mismatch,
    }


def compute_run_metrics(
    records: Sequence[RequestRecord], duration_s: float, analysis: AnalysisConfig, long_prompt_tokens: int
) -> dict[str, Any]:
    """Every statistic of one run, as a JSON-ready dict."""
    from cadence.bench.interference import interference_metrics

    ok = [r for r in records if r.ok]
    return {
        "requests": {"total": len(records), "ok": len(ok), "failed": len(records) - len(ok)},
        "throughput": throughput(records, duration_s),
        "ttft": summarize(v for r in ok if (v := ttft(r)) is not None),
        "itl": summarize(g for r in ok for g in itl_gaps(r)),
        "tpot": summarize(v for r in ok if (v := tpot(r)) is not None),
        "e2e": summarize(v for r in ok if (v := e2e(r)) is not None),
        "ttft_by_bucket": ttft_by_bucket(records, analysis.ttft_buckets),
        "interference": interference_metrics(records, long_prompt_tokens),
        "goodput": goodput(records, analysis.slo, duration_s),
        "failures": failures(records),
        "token_counting": token_counting(records),
    }
