"""PNG plots of a diagnosis (matplotlib's object API on the Agg canvas: no display needed)."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cadence.diagnose.analysis import Diagnosis
from cadence.diagnose.replay import Recommendation
from cadence.telemetry.attribution import CAUSES

_CAUSE_COLORS = {"prefill": "tab:red", "preemption": "tab:orange", "idle": "tab:gray",
                 "slow_step": "tab:purple"}


def _save(fig: Figure, path: str) -> str:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def plot_gaps(d: Diagnosis, path: str, long_prompt: int = 256) -> str:
    """Every stream gap over time (log y), stalls coloured by cause, long prefills shaded."""
    t0 = d.recording.t0
    fig = Figure(figsize=(9, 4.2))
    ax = fig.add_subplot()
    xs, ys = [], []
    for r in d.recording.requests:
        for a, b in zip(r.token_times, r.token_times[1:]):
            xs.append(b - t0)
            ys.append(max(b - a, 1e-4) * 1000)
    ax.scatter(xs, ys, s=4, color="tab:blue", alpha=0.4, label="gaps")
    for cause in CAUSES:
        stalls = [s for s in d.stalls if s.cause == cause]
        if stalls:
            ax.scatter([s.t_token - t0 for s in stalls], [s.gap_s * 1000 for s in stalls], s=28,
                       color=_CAUSE_COLORS[cause], label=f"stall: {cause} ({len(stalls)})")
    for r in d.recording.requests:
        if r.prompt_tokens >= long_prompt and r.first_token is not None:
            start = (r.first_scheduled if r.first_scheduled is not None else r.arrival) - t0
            ax.axvspan(start, r.first_token - t0, color="tab:red", alpha=0.1, lw=0)
            ax.text(start, 0.98, f"prompt {r.prompt_tokens} tok", transform=ax.get_xaxis_transform(),
                    fontsize=7, color="tab:red", va="top")
    ax.axhline(d.target_itl_s * 1000, color="black", ls="--", lw=1, label="ITL target")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("gap between tokens (ms, log)")
    ax.set_title("stream gaps; stalls by cause; shaded: long prompts' prefill windows")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def bucket_order(label: str) -> int:
    """Sort key of a prompt-length bucket label ('0', '1-64', ..., '>4096'): its lower bound,
    so buckets read in length order (as strings '257-1024' sorted before '65-256')."""
    digits = label.lstrip(">").split("-")[0]
    return int(digits) + (1 if label.startswith(">") else 0)


def plot_causes(d: Diagnosis, path: str) -> str:
    return _save(causes_figure(d.caused_by_bucket), path)


def causes_figure(caused_by_bucket: dict[str, float]) -> Figure:
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    items = sorted(caused_by_bucket.items(), key=lambda x: bucket_order(x[0]))
    ax.bar([b for b, _ in items], [s * 1000 for _, s in items], color="tab:red")
    ax.set_xlabel("causing prompt length (tokens)")
    ax.set_ylabel("stream time lost (ms)")
    ax.set_title("interference caused, by prompt length")
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_ttft(d: Diagnosis, path: str) -> str:
    fig = Figure(figsize=(9, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    rows = d.buckets
    x = np.arange(len(rows))
    labels = [f"{b['bucket']}\n(n={b['count']})" for b in rows]
    for off, key, color in ((-0.2, "ttft_p50", "tab:green"), (0.2, "ttft_p95", "tab:orange")):
        ax1.bar(x + off, [(b[key] or 0) * 1000 for b in rows], width=0.4, color=color,
                label=key.replace("ttft_", ""))
    ax1.set_xticks(x, labels, fontsize=8)
    ax1.set_xlabel("prompt length (tokens)")
    ax1.set_ylabel("TTFT (ms)")
    ax1.set_title("TTFT by prompt length")
    ax1.legend(fontsize=8)
    queue = [(b["queue_mean"] or 0) * 1000 for b in rows]
    prefill = [(b["prefill_mean"] or 0) * 1000 for b in rows]
    ax2.bar(x, queue, color="tab:gray", label="queue (arrival -> first scheduled)")
    ax2.bar(x, prefill, bottom=queue, color="tab:red", label="prefill (-> first token)")
    ax2.set_xticks(x, labels, fontsize=8)
    ax2.set_xlabel("prompt length (tokens)")
    ax2.set_ylabel("mean ms")
    ax2.set_title("queue vs prefill time")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_whatif(rec: Recommendation, path: str) -> str:
    return _save(whatif_figure(rec), path)


def whatif_figure(rec: Recommendation) -> Figure:
    """Candidates' largest gap vs TTFT p99. Settings often land on nearly the same point, so
    their names go in a column right of the plot, in the points' vertical order, each joined
    to its point by a thin line: labels never overlap however close the points are."""
    points = [o for o in rec.candidates
              if o.metrics["ttft_p99_s"] is not None and o.metrics["max_gap_s"] is not None]
    fig = Figure(figsize=(9, max(4.6, 0.16 * len(points) + 1.2)))
    ax = fig.add_subplot()
    fig.subplots_adjust(right=0.62)
    for o in points:
        m = o.metrics
        color = "tab:green" if o is rec.best else ("tab:blue" if o.meets_slo else "tab:gray")
        ax.scatter(m["max_gap_s"] * 1000, m["ttft_p99_s"] * 1000, color=color, s=30)
    ranked = sorted(points, key=lambda o: o.metrics["ttft_p99_s"])
    for k, o in enumerate(ranked):
        m = o.metrics
        y_label = (k + 0.5) / len(ranked)  # evenly spaced, bottom to top in the points' order
        ax.annotate(o.setting.name, (m["max_gap_s"] * 1000, m["ttft_p99_s"] * 1000),
                    xytext=(1.03, y_label), textcoords="axes fraction", fontsize=7,
                    va="center", annotation_clip=False,
                    color="tab:green" if o is rec.best else "black",
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.6"})
    mm = rec.measured.metrics
    if mm["max_gap_s"] is not None and mm["ttft_p99_s"] is not None:
        ax.scatter(mm["max_gap_s"] * 1000, mm["ttft_p99_s"] * 1000, marker="*", s=120,
                   color="black", label="measured (recorded setting)")
    if "itl" in rec.slo:
        ax.axvline(rec.slo["itl"] * 1000, color="tab:red", ls="--", lw=1, label="SLO itl")
    if "ttft" in rec.slo:
        ax.axhline(rec.slo["ttft"] * 1000, color="tab:orange", ls="--", lw=1, label="SLO ttft")
    ax.set_xscale("log")
    ax.set_xlabel("largest stream gap (ms, log)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title("simulated settings (green: recommended)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def plot_all(d: Diagnosis, rec: Recommendation | None, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = [plot_gaps(d, os.path.join(out_dir, "gaps.png")),
             plot_causes(d, os.path.join(out_dir, "interference_by_prompt.png")),
             plot_ttft(d, os.path.join(out_dir, "ttft_queue_prefill.png"))]
    if rec is not None:
        paths.append(plot_whatif(rec, os.path.join(out_dir, "whatif.png")))
    return paths
