"""The diagnosis in words (Markdown-ish plain text) and as JSON."""

from __future__ import annotations

from typing import Any

from cadence.diagnose.analysis import Diagnosis, stall_summary
from cadence.diagnose.replay import METRICS, Outcome, Recommendation

_METRIC_NAMES = {
    "ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99", "long_ttft_s": "long prompts' TTFT (max)",
    "itl_p50_s": "ITL p50", "itl_p99_s": "ITL p99", "max_gap_s": "largest stream gap",
    "slo_attainment": "requests meeting the SLO",
}


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if key == "slo_attainment":
        return f"{100 * value:.0f}%"
    return f"{value * 1000:.0f} ms"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"


def report_lines(d: Diagnosis, rec: Recommendation | None) -> list[str]:
    r = d.recording
    s = stall_summary(d)
    lines = [f"# cadence diagnose: {r.name}", ""]
    setting = r.settings.get("policy")
    lines.append(f"Source: {r.source}, {len(r.requests)} requests"
                 + (f", {len(r.steps)} engine steps" if r.steps else "")
                 + (f"; recorded under policy {setting}, budget "
                    f"{r.settings.get('max_num_batched_tokens')}" if setting else "") + ".")
    lines.append(f"ITL target for stalls: {d.target_itl_s * 1000:.0f} ms; solo ITL (gaps with no "
                 f"prompt next to them): {_ms(d.solo_itl_s)}. Attribution: "
                 + ("exact, from the engine's steps." if d.exact else
                    "from client times only: a gap is blamed on the prompts whose "
                    "send-to-first-token window overlapped it (coarse)."))
    lines += ["", "## Interference"]
    if d.interference_present:
        prompts = d.cause_prompt_tokens
        lines.append(
            f"YES: prefill/decode interference is present. {len(d.prefill_stalls)} stalls over "
            f"the target in {s['streams_stalled_by_prefill']} streams were caused by other "
            f"requests' prompts (longest {_ms(s['prefill_stall_max_s'])}); streams lost "
            f"{d.total_caused_s:.2f} s in total to prefill "
            f"({100 * s['interference_share']:.1f}% of all decode time).")
        if prompts:
            lines.append("Caused by prompts of " + ", ".join(f"{p} tokens" for p in prompts)
                         + " (the requests that caused at least 10% of it).")
    else:
        lines.append("NO prefill/decode stall over the target was found"
                     + (f" ({s['num_stalls']} stalls had other causes)." if s["num_stalls"] else "."))
    lines.append(f"Gaps: {s['num_gaps']}, ITL p50 {_ms(s['itl_p50_s'])}, p99 "
                 f"{_ms(s['itl_p99_s'])}, largest {_ms(s['max_gap_s'])}. Stalls by cause: "
                 + ", ".join(f"{k} {v}" for k, v in s["num_stalls_by_cause"].items()) + ".")
    if d.caused_by_bucket:
        lines += ["", "Interference caused, by the causing prompt's length:"]
        for bucket, sec in sorted(d.caused_by_bucket.items(), key=lambda x: -x[1]):
            lines.append(f"  prompt {bucket:>10} tokens: {sec * 1000:8.0f} ms")
    if d.top_causes:
        lines += ["", "Top causes (request, prompt tokens, stream time caused):"]
        for rid, prompt, sec in d.top_causes[:5]:
            lines.append(f"  {rid}: prompt {prompt} tokens, {sec * 1000:.0f} ms")
    lines += ["", "## TTFT by prompt length, queue vs prefill time",
              "  prompt tokens   n   TTFT p50   TTFT p95   TTFT max   queue p50  prefill p50"]
    for b in d.buckets:
        lines.append(f"  {b['bucket']:>12} {b['count']:>4} {_ms(b['ttft_p50']):>10} "
                     f"{_ms(b['ttft_p95']):>10} {_ms(b['ttft_max']):>10} "
                     f"{_ms(b['queue_p50']):>11} {_ms(b['prefill_p50']):>12}")
    if not any(b["queue_p50"] is not None for b in d.buckets):
        lines.append("  (queue and prefill time need engine timestamps: a --trace file)")
    if rec is not None:
        lines += ["", "## What-if: the recorded workload replayed in the simulator"]
        lines.append(f"SLO: {', '.join(f'{k} <= {v * 1000:.0f} ms' for k, v in rec.slo.items())}"
                     + (" (no --slo given: the ITL target)" if rec.slo_assumed else "")
                     + "; a request meets it when its TTFT and its largest gap are within.")
        lines.append(f"Step cost: {rec.cost_model}.")
        if rec.baseline is not None and rec.sim_error:
            errs = ", ".join(f"{_METRIC_NAMES[k]} {100 * v:.0f}%" for k, v in rec.sim_error.items())
            lines.append(f"Simulator error on the recorded setting ({rec.baseline.setting.name}): "
                         f"{errs}. Stated error (worst of TTFT p99, ITL p99, largest gap): "
                         f"{100 * (rec.stated_error or 0):.0f}%.")
        lines += ["", "  setting                          meets  TTFT p99  long TTFT  ITL p99  "
                  "max gap"]
        for o in sorted(rec.candidates, key=lambda o: (-o.metrics["slo_attainment"], o.score)):
            m = o.metrics
            mark = " <- recommended" if o is rec.best else ""
            lines.append(f"  {o.setting.name:<32} {_fmt('slo_attainment', m['slo_attainment']):>5}"
                         f" {_ms(m['ttft_p99_s']):>9} {_ms(m['long_ttft_s']):>10}"
                         f" {_ms(m['itl_p99_s']):>8} {_ms(m['max_gap_s']):>8}{mark}")
        best = rec.best
        if best is not None:
            lines += ["", "## Recommendation",
                      f"Run: cadence serve {best.setting.serve_flags}"
                      + ("" if best.meets_slo else
                         "  (closest: no simulated setting meets the SLO for every request)")]
            lines.append("Predicted effect (measured now -> predicted):")
            for k in METRICS:
                lines.append(f"  {_METRIC_NAMES[k]:<28} {_fmt(k, rec.measured.metrics.get(k)):>8}"
                             f" -> {_fmt(k, best.metrics.get(k)):>8}")
        if rec.split_advice:
            lines += ["", "## Split cores", "Run: cadence serve --policy adaptive",
                      rec.split_advice]
    return lines


def _outcome_json(o: Outcome | None) -> dict[str, Any] | None:
    if o is None:
        return None
    return {"setting": o.setting.name if o.setting else None,
            "serve_flags": o.setting.serve_flags if o.setting else None,
            "metrics": o.metrics, "meets_slo": o.meets_slo, "score": o.score}


def report_json(d: Diagnosis, rec: Recommendation | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": d.recording.source, "name": d.recording.name,
        "settings": d.recording.settings, "target_itl_s": d.target_itl_s, "exact": d.exact,
        "interference_present": d.interference_present,
        "cause_prompt_tokens": d.cause_prompt_tokens, "summary": stall_summary(d),
        "caused_by_bucket_s": d.caused_by_bucket,
        "top_causes": [{"req_id": r, "prompt_tokens": p, "caused_s": s} for r, p, s in d.top_causes],
        "stalls": [s.to_dict() for s in d.stalls], "buckets": d.buckets,
    }
    if rec is not None:
        out["recommendation"] = {
            "slo": rec.slo, "slo_assumed": rec.slo_assumed, "cost_model": rec.cost_model,
            "measured": _outcome_json(rec.measured), "baseline": _outcome_json(rec.baseline),
            "sim_error": rec.sim_error, "stated_error": rec.stated_error,
            "candidates": [_outcome_json(o) for o in rec.candidates],
            "best": _outcome_json(rec.best), "num_cores": rec.num_cores,
            "split_advice": rec.split_advice}
    return out
