"""Reading a sweep: each setting's point on the latency map, the Pareto front, the SLO choice.

Map axes: x = median TTFT of long prompts (the new request's wait), y = p99 ITL of interfered
streams (the running requests' stall); both fall back to all requests when a run has no long
prompt or no interfered stream, and the point says so. Lower is better on both.

Choice: a setting meets the SLOs when it had no failed request and, for every SLO set, the p99
of that metric over all requests is within the limit. Among those the highest output throughput
wins; if none meets them, the one closest to meeting them (smallest worst ratio p99 / limit).
"""

from __future__ import annotations

from typing import Any

_SLO_METRIC = {"ttft": "ttft", "itl": "itl", "tpot": "tpot", "e2e": "e2e"}


def summarize_setting(name: str, setting: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """One sweep row from a bench result (first run)."""
    m = result["runs"][0]["metrics"]
    inter = m["interference"]
    long_ttft = inter["ttft_long"] if inter["ttft_long"]["count"] else m["ttft"]
    inter_itl = inter["itl_interfered"] if inter["itl_interfered"]["count"] else m["itl"]
    return {
        "name": name,
        **setting,
        "status": "ok",
        "x_ttft_long_p50": long_ttft["p50"],
        "x_source": "long prompts" if inter["ttft_long"]["count"] else "all requests (no long prompt)",
        "y_itl_interfered_p99": inter_itl["p99"],
        "y_source": "interfered streams" if inter["itl_interfered"]["count"] else "all streams (none interfered)",
        "output_tps": m["throughput"]["output_tps"],
        "request_rps": m["throughput"]["request_rps"],
        "goodput_rps": m["goodput"]["goodput_rps"],
        "failed_requests": m["requests"]["failed"],
        "p99": {k: m[k]["p99"] for k in _SLO_METRIC.values()},
        "ttft_long": inter["ttft_long"],
        "itl_interfered": inter["itl_interfered"],
        "itl_other": inter["itl_other"],
    }


def _point(row: dict[str, Any]) -> tuple[float, float] | None:
    x, y = row.get("x_ttft_long_p50"), row.get("y_itl_interfered_p99")
    return None if x is None or y is None else (x, y)


def pareto_front(rows: list[dict[str, Any]]) -> list[str]:
    """Names of the settings no other setting beats on both axes (ties kept), by x."""
    points = [(r["name"], p) for r in rows if r["status"] == "ok" and (p := _point(r)) is not None]
    front = []
    for name, (x, y) in points:
        dominated = any(
            (ox <= x and oy <= y) and (ox < x or oy < y) for other, (ox, oy) in points if other != name
        )
        if not dominated:
            front.append((x, name))
    return [name for _, name in sorted(front)]


def slo_score(row: dict[str, Any], limits: dict[str, float]) -> float | None:
    """Worst p99 / limit over the SLOs set (<= 1 meets them all); None if a metric is missing."""
    ratios = []
    for key, limit in limits.items():
        value = row["p99"].get(_SLO_METRIC[key])
        if value is None:
            return None
        ratios.append(value / limit)
    return max(ratios) if ratios else 0.0


def choose_setting(rows: list[dict[str, Any]], limits: dict[str, float]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    scored = [(slo_score(r, limits), r) for r in ok]
    meeting = [(s, r) for s, r in scored if s is not None and s <= 1.0 and r["failed_requests"] == 0]
    if meeting:
        score, best = max(meeting, key=lambda sr: sr[1]["output_tps"])
        if limits:
            reason = (f"meets every SLO {limits} at p99 (worst p99/limit {score:.2f}) with the highest "
                      f"output throughput among the {len(meeting)} that do ({best['output_tps']:.1f} tok/s)")
        else:
            reason = f"no SLO given: highest output throughput ({best['output_tps']:.1f} tok/s)"
        return {"name": best["name"], "meets_slo": True, "score": score, "reason": reason}
    candidates = [(s, r) for s, r in scored if s is not None] or [(float("inf"), r) for _, r in scored]
    score, best = min(candidates, key=lambda sr: (sr[0], -sr[1]["output_tps"]))
    return {
        "name": best["name"],
        "meets_slo": False,
        "score": score if score != float("inf") else None,
        "reason": f"no setting meets every SLO {limits}; closest: worst p99/limit {score:.2f}"
        + (f", {best['failed_requests']} failed requests" if best["failed_requests"] else ""),
    }
