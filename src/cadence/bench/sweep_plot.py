"""The sweep's latency/throughput map: one marker per setting, colour and size = throughput,
the Pareto front joined, the chosen setting ringed, SLO limits as guide lines."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_sweep_map(sweep: dict[str, Any], path: str) -> str:
    rows = [r for r in sweep["settings"] if r["status"] == "ok" and r.get("x_ttft_long_p50") is not None
            and r.get("y_itl_interfered_p99") is not None]
    fig = Figure(figsize=(7.5, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if rows:
        x = np.array([r["x_ttft_long_p50"] for r in rows]) * 1000
        y = np.array([r["y_itl_interfered_p99"] for r in rows]) * 1000
        tps = np.array([r["output_tps"] for r in rows])
        sizes = 60 + 340 * (tps / tps.max() if tps.max() > 0 else np.zeros_like(tps))
        sc = ax.scatter(x, y, s=sizes, c=tps, cmap="viridis", edgecolors="black", linewidths=0.5, zorder=3)
        fig.colorbar(sc, ax=ax, label="output throughput (tok/s)")
        for r, xi, yi in zip(rows, x, y):
            ax.annotate(r["name"], (xi, yi), textcoords="offset points", xytext=(6, 6), fontsize=8)
        by_name = {r["name"]: (xi, yi) for r, xi, yi in zip(rows, x, y)}
        front = [by_name[n] for n in sweep["pareto"] if n in by_name]
        if front:
            fx, fy = zip(*front)
            ax.plot(fx, fy, "--", color="tab:red", lw=1.2, zorder=2, label="Pareto front")
        choice = sweep.get("choice")
        if choice and choice["name"] in by_name:
            cx, cy = by_name[choice["name"]]
            ax.scatter([cx], [cy], s=600, facecolors="none", edgecolors="tab:red", linewidths=2, zorder=4,
                       label=f"chosen: {choice['name']}")
    slo = sweep["config"]["slo"]
    # SLO guide lines only where they do not squash the points (within 2x of the data); an
    # off-chart limit is named in the legend instead.
    xmax = max((r["x_ttft_long_p50"] for r in rows), default=0.0) * 1000
    ymax = max((r["y_itl_interfered_p99"] for r in rows), default=0.0) * 1000
    if "itl" in slo:
        limit = slo["itl"] * 1000
        if not rows or limit <= 2 * ymax:
            ax.axhline(limit, color="0.4", ls=":", lw=1, label=f"ITL SLO {limit:.0f} ms")
        else:
            ax.plot([], [], " ", label=f"ITL SLO {limit:.0f} ms (above the chart)")
    if "ttft" in slo:
        limit = slo["ttft"] * 1000
        if not rows or limit <= 2 * xmax:
            ax.axvline(limit, color="0.4", ls="-.", lw=1, label=f"TTFT SLO {limit:.0f} ms")
        else:
            ax.plot([], [], " ", label=f"TTFT SLO {limit:.0f} ms (right of the chart)")
    ax.set_xlabel("TTFT of long prompts, p50 (ms)")
    ax.set_ylabel("ITL of interfered streams, p99 (ms)")
    ax.set_title(f"scheduler settings: new request's wait vs running streams' stall ({sweep['config']['workload']})")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
