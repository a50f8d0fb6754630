"""PNG plots of one run, drawn from the JSON result (matplotlib's object API with the Agg
canvas: no pyplot global state, no display needed).

- ITL CDF, interfered streams vs the rest (log axis: the stalls are orders above the rest).
- TTFT per prompt-length bucket.
- Per-stream token timeline with long prefill windows shaded, server /metrics underneath.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cadence.bench.interference import PrefillWindow, is_interfered
from cadence.bench.metrics import itl_gaps
from cadence.bench.records import RequestRecord


def _save(fig: Figure, path: str) -> str:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _records(run: dict[str, Any]) -> list[RequestRecord]:
    return [RequestRecord.from_json(r) for r in run["records"]]


def _windows(run: dict[str, Any]) -> list[PrefillWindow]:
    return [PrefillWindow(**w) for w in run["metrics"]["interference"]["windows"]]


def plot_itl_cdf(run: dict[str, Any], path: str) -> str:
    records, windows = _records(run), _windows(run)
    groups = {"interfered": [], "other": []}
    for r in records:
        if r.ok:
            groups["interfered" if is_interfered(r, windows) else "other"].extend(itl_gaps(r))
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, color in (("interfered", "tab:red"), ("other", "tab:blue")):
        gaps = np.sort(np.asarray(groups[name])) * 1000
        if gaps.size:
            # Zero gaps (tokens of one multi-token chunk) sit at the axis' left edge: a log axis
            # has no 0, and dropping them would shift the CDF.
            shown = np.maximum(gaps, 0.01)
            ax.step(shown, np.arange(1, gaps.size + 1) / gaps.size, where="post", color=color,
                    label=f"{name} (n={gaps.size}, p99={np.percentile(gaps, 99):.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency (ms, log scale)")
    ax.set_ylabel("fraction of gaps")
    ax.set_title(f"ITL CDF: streams decoding during a long prefill vs the rest ({run['label']})")
    if any(groups.values()):
        ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_ttft_buckets(run: dict[str, Any], path: str) -> str:
    buckets = [b for b in run["metrics"]["ttft_by_bucket"] if b["ttft"]["count"]]
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    x = np.arange(len(buckets))
    for offset, key, color in ((-0.25, "p50", "tab:green"), (0.0, "p95", "tab:orange"), (0.25, "p99", "tab:red")):
        ax.bar(x + offset, [b["ttft"][key] * 1000 for b in buckets], width=0.25, color=color, label=key)
    ax.set_xticks(x, [f"{b['bucket']}\n(n={b['ttft']['count']})" for b in buckets])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(f"TTFT by prompt length ({run['label']})")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_timeline(run: dict[str, Any], path: str) -> str:
    records, windows = _records(run), _windows(run)
    samples = run["server_metrics"]["samples"] if run["server_metrics"]["available"] else []
    rows_height = min(max(3.0, 0.22 * len(records)), 18.0)  # grows with the streams, capped
    fig = Figure(figsize=(9, rows_height + (2.5 if samples else 1.2)))
    if samples:
        ax, ax_srv = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [rows_height, 2.0]})
    else:
        ax, ax_srv = fig.add_subplot(), None
    for w in windows:
        ax.axvspan(w.start, w.end, color="tab:red", alpha=0.12, lw=0)
        if ax_srv is not None:
            ax_srv.axvspan(w.start, w.end, color="tab:red", alpha=0.12, lw=0)
    order = sorted(records, key=lambda r: r.send_time)
    for row, r in enumerate(order):
        end = r.end_time if r.end_time is not None else r.send_time
        ax.hlines(row, r.send_time, end, color="0.8", lw=1)
        color = "tab:red" if r.index in {w.index for w in windows} else ("tab:gray" if not r.ok else "tab:blue")
        if r.chunk_times:
            ax.plot(r.chunk_times, [row] * len(r.chunk_times), "|", color=color, ms=6)
        if not r.ok:
            ax.plot([end], [row], "x", color="black", ms=7)
    if len(order) <= 80:
        ax.set_yticks(range(len(order)), [f"#{r.index} {r.kind} (prompt {r.prompt_tokens} tok)" for r in order], fontsize=7)
    else:
        ax.set_ylabel("requests by send time")
    ax.set_title(f"token timeline ({run['label']}): ticks = chunks, shaded = long prefill windows, x = failed")
    ax.invert_yaxis()
    if ax_srv is not None:
        _server_panel(ax_srv, samples)
    else:
        ax.set_xlabel("seconds since start")
    return _save(fig, path)


def _server_panel(ax, samples: list[dict[str, Any]]) -> None:
    """Running and waiting requests as steps, KV usage (%) on its own right axis; preemptions
    as dotted lines."""
    t = [s["t"] for s in samples]
    handles = []
    if any("kv_cache_usage_perc" in s for s in samples):
        ax_kv = ax.twinx()
        handles += ax_kv.step(t, [s.get("kv_cache_usage_perc", np.nan) * 100 for s in samples],
                              where="post", color="tab:purple", label="KV usage %")
        ax_kv.set_ylim(0, 100)
        ax_kv.set_ylabel("KV usage %", color="tab:purple")
    for key, color in (("num_requests_running", "tab:blue"), ("num_requests_waiting", "tab:orange")):
        if any(key in s for s in samples):
            handles += ax.step(t, [s.get(key, np.nan) for s in samples], where="post",
                               color=color, label=key.replace("num_requests_", ""))
    pre = [(s["t"], s["num_preemptions_total"]) for s in samples if "num_preemptions_total" in s]
    for (_, a), (tb, b) in zip(pre, pre[1:]):
        if b > a:
            ax.axvline(tb, color="black", ls=":", lw=1)
    # KV offload marks (bench.timeline.kv_events): triangles along the bottom, one color each.
    from cadence.bench.timeline import kv_events

    for kind, (color, marker) in _KV_MARKS.items():
        ts = [m["t"] for m in kv_events(samples) if m["kind"] == kind]
        if ts:
            handles += ax.plot(ts, [0] * len(ts), marker, color=color, ms=6, ls="none",
                               clip_on=False, label=kind.replace("_", " "))
    ax.set_ylabel("requests")
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    ax.set_xlabel("seconds since start (dotted: preemptions; triangles: KV swaps/spills/reloads)")


_KV_MARKS = {
    "swap_out_host": ("tab:green", "v"),
    "swap_in_host": ("tab:green", "^"),
    "swap_out_disk": ("tab:brown", "v"),
    "swap_in_disk": ("tab:brown", "^"),
    "prefix_spill_disk": ("tab:gray", "v"),
    "prefix_reload_disk": ("tab:olive", "^"),
    "offload_failure": ("tab:red", "x"),
}


def plot_run(run: dict[str, Any], out_dir: str, prefix: str) -> list[str]:
    """All plots of one run into out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [
        plot_itl_cdf(run, os.path.join(out_dir, f"{prefix}itl_cdf.png")),
        plot_ttft_buckets(run, os.path.join(out_dir, f"{prefix}ttft_by_bucket.png")),
        plot_timeline(run, os.path.join(out_dir, f"{prefix}timeline.png")),
    ]
