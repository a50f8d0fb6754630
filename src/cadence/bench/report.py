"""The benchmark result as JSON (schema.py) and as a Markdown summary.

Everything downstream (Markdown, plots, sweeps) reads the JSON-ready dict, never live objects,
so a saved result can be re-rendered.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from typing import Any

from cadence.bench.config import BenchConfig
from cadence.bench.environment import describe_environment
from cadence.bench.interference import prefill_windows
from cadence.bench.metrics import compute_run_metrics
from cadence.bench.runner import RunOutcome
from cadence.bench.schema import SCHEMA_VERSION
from cadence.bench.timeline import join_timeline
from cadence.bench.workloads import Workload


def config_json(cfg: BenchConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["client"].pop("api_key", None)  # never write secrets into results
    return out


def build_result(
    cfg: BenchConfig, workload: Workload, runs: list[RunOutcome], long_prompt_tokens: int, server: dict[str, Any]
) -> dict[str, Any]:
    """The full JSON result of a bench invocation (one entry in `runs` per arrival run)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "bench",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config_json(cfg),
        "environment": describe_environment(),
        "server": server,
        "workload": {
            "name": workload.config.name,
            "num_requests": len(workload.requests),
            "tokens_exact": workload.tokens_exact,
            "token_source": workload.token_source,
            "long_prompt_tokens": long_prompt_tokens,
            "prompt_tokens_total": sum(r.prompt_tokens for r in workload.requests),
            "distinct_prompts": len({r.prompt for r in workload.requests}),
        },
        "runs": [
            {
                "label": run.label,
                "arrival": run.arrival,
                "duration_s": run.duration_s,
                "metrics": compute_run_metrics(run.records, run.duration_s, cfg.analysis, long_prompt_tokens),
                "records": [r.to_json() for r in run.records],
                "server_metrics": run.server_metrics,
                "timeline": join_timeline(run.records, prefill_windows(run.records, long_prompt_tokens),
                                          run.server_metrics.get("samples", [])),
            }
            for run in runs
        ],
    }


def write_json(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _stats_row(name: str, s: dict[str, Any]) -> str:
    return f"| {name} | {s['count']} | {ms(s['p50'])} | {ms(s['p95'])} | {ms(s['p99'])} | {ms(s['max'])} |"


def run_markdown(run: dict[str, Any]) -> list[str]:
    m = run["metrics"]
    tp, inter, gp = m["throughput"], m["interference"], m["goodput"]
    lines = [
        f"### {run['label']} ({', '.join(f'{k}={v}' for k, v in run['arrival'].items())})",
        "",
        f"{m['requests']['ok']}/{m['requests']['total']} requests ok in {run['duration_s']:.2f} s: "
        f"{tp['request_rps']:.2f} req/s, {tp['output_tps']:.1f} output tok/s, "
        f"goodput {gp['goodput_rps']:.2f} req/s "
        + (f"({gp['good_requests']} met {gp['slo']})." if gp["slo"] else "(no SLO set: every successful request counts)."),
        "",
        "| metric (ms) | n | p50 | p95 | p99 | max |",
        "|---|---|---|---|---|---|",
        _stats_row("TTFT", m["ttft"]),
        _stats_row("ITL", m["itl"]),
        _stats_row("TPOT", m["tpot"]),
        _stats_row("E2E", m["e2e"]),
        _stats_row("ITL, interfered streams", inter["itl_interfered"]),
        _stats_row("ITL, other streams", inter["itl_other"]),
        _stats_row("ITL gaps inside prefill windows", inter["itl_in_windows"]),
        _stats_row(f"TTFT, long prompts (>= {inter['long_prompt_tokens']} tok)", inter["ttft_long"]),
        _stats_row("TTFT, short prompts", inter["ttft_short"]),
        "",
        "TTFT by prompt length (tokens):",
        "",
        "| bucket | n | p50 | p95 | p99 | max |",
        "|---|---|---|---|---|---|",
        *(_stats_row(b["bucket"], b["ttft"]) for b in m["ttft_by_bucket"] if b["ttft"]["count"]),
        "",
        f"Interfered requests: {inter['interfered_requests'] or 'none'}; "
        f"{len(inter['windows'])} long prefill window(s).",
    ]
    fails = m["failures"]
    if fails["count"]:
        lines += ["", f"Failures ({fails['count']}): {fails['by_kind']}"]
        for f in fails["requests"][:10]:
            status = f" HTTP {f['http_status']}" if f["http_status"] else ""
            lines.append(f"- request {f['index']}: {f['kind']}{status}: {f['message']} ({f['tokens_received']} tokens received)")
    sm = run["server_metrics"]
    if sm["available"]:
        kv = [s["kv_cache_usage_perc"] for s in sm["samples"] if "kv_cache_usage_perc" in s]
        pre = [s["num_preemptions_total"] for s in sm["samples"] if "num_preemptions_total" in s]
        lines += ["", f"Server /metrics: {len(sm['samples'])} scrapes"
                  + (f", peak KV usage {max(kv):.1%}" if kv else "")
                  + (f", preemptions during run {pre[-1] - pre[0]:.0f}" if pre else "") + "."]
        marks = run.get("timeline", {}).get("kv_events", [])
        if marks:
            moved: dict[str, float] = {}
            for mark in marks:
                moved[mark["kind"]] = moved.get(mark["kind"], 0) + mark["blocks"]
            lines.append("KV offload (blocks): " + ", ".join(
                f"{kind.replace('_', ' ')} {n:.0f}" for kind, n in moved.items()) + ".")
        for w in run.get("timeline", {}).get("windows", []):
            lines.append(f"- prefill window of #{w['index']} ({w['end'] - w['start']:.2f} s): peak running "
                         f"{w['max_num_requests_running']}, waiting {w['max_num_requests_waiting']}, "
                         f"KV {_pct(w['max_kv_cache_usage_perc'])}, preemptions {w['preemptions']}")
    else:
        lines += ["", f"Server /metrics: not available ({sm.get('note', '')})."]
    tc = m["token_counting"]
    lines += ["", f"Token counting: {tc['rule']} Chunks: {tc['chunks']}, multi-token chunks: "
              f"{tc['multi_token_chunks']}, requests where usage != tokens seen: {len(tc['usage_mismatch_requests'])}, "
              f"where the server's prompt length != ours: {len(tc['prompt_tokens_mismatch_requests'])}."]
    return lines


def markdown_summary(result: dict[str, Any], plots: dict[str, list[str]] | None = None) -> str:
    cfg, wl, env = result["config"], result["workload"], result["environment"]
    lengths = "exact" if wl["tokens_exact"] else "APPROXIMATE"
    lines = [
        f"# cadence bench: {wl['name']}",
        "",
        f"- server: {cfg['client']['url']} model `{result.get('server', {}).get('model', cfg['client']['model'])}`",
        f"- workload: {wl['name']}, {wl['num_requests']} requests, seed {cfg['workload']['seed']}, "
        f"prompt lengths {lengths} ({wl['token_source']}), long prompts >= {wl['long_prompt_tokens']} tokens",
        f"- environment: {env['host']}, {env['cpu_count']} CPUs, Python {env['python']}, {env['platform']}",
        f"- created {result['created_at']}, schema {result['schema_version']}",
        "",
    ]
    for run in result["runs"]:
        lines += run_markdown(run)
        for path in (plots or {}).get(run["label"], []):
            lines += ["", f"![{os.path.basename(path)}]({os.path.basename(path)})"]
        lines.append("")
    return "\n".join(lines)
