"""Join the server's /metrics samples onto the client's timeline.

Both share the run's clock (seconds since its start), so each long prefill window gets the
server state seen during it (peak running/waiting/KV usage, preemptions, KV blocks swapped,
spilled or reloaded), each request the state last scraped before it was sent and before its
first token, and the KV offload events (swap-out/in to the host or disk tier, prefix-cache
spill/reload) as marks at the scrape that saw them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from cadence.bench.interference import PrefillWindow
from cadence.bench.records import RequestRecord

_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")

# KV offload marks on the timeline: event kind -> the scraped counter (blocks) that counts it.
KV_EVENTS = {
    "swap_out_host": "kv_blocks_swapped_out_total",
    "swap_in_host": "kv_blocks_swapped_in_total",
    "swap_out_disk": "kv_blocks_swapped_out_disk_total",
    "swap_in_disk": "kv_blocks_swapped_in_disk_total",
    "prefix_spill_disk": "prefix_cache_blocks_spilled_total",
    "prefix_reload_disk": "prefix_cache_blocks_reloaded_total",
    "offload_failure": "kv_offload_failures_total",
}


def state_at(samples: Sequence[dict[str, Any]], times: Sequence[float], t: float | None) -> dict[str, Any] | None:
    """The last sample taken at or before t (None before the first sample or for t None)."""
    if t is None:
        return None
    i = bisect.bisect_right(times, t) - 1
    return dict(samples[i]) if i >= 0 else None


def window_state(samples: Sequence[dict[str, Any]], w: PrefillWindow) -> dict[str, Any]:
    """Peaks of the gauges and the preemptions counted while the window was open, using the
    samples inside it plus the last one before it (the state the window opened in)."""
    times = [s["t"] for s in samples]
    lo = max(bisect.bisect_right(times, w.start) - 1, 0)
    hi = bisect.bisect_right(times, w.end)
    inside = list(samples[lo:hi])
    out: dict[str, Any] = {"index": w.index, "start": w.start, "end": w.end, "samples": len(inside)}
    for key in _GAUGES:
        values = [s[key] for s in inside if key in s]
        out[f"max_{key}"] = max(values) if values else None
    pre = [s["num_preemptions_total"] for s in inside if "num_preemptions_total" in s]
    out["preemptions"] = (pre[-1] - pre[0]) if len(pre) >= 2 else (0.0 if pre else None)
    for kind, key in KV_EVENTS.items():
        values = [s[key] for s in inside if key in s]
        if values:
            out[kind] = values[-1] - values[0]  # blocks moved while the window was open
    return out


def kv_events(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Swap, spill and reload marks: one per scrape interval in which a KV offload counter
    rose, at the scrape that saw it, with the blocks moved since the previous scrape."""
    marks = []
    for kind, key in KV_EVENTS.items():
        seen = [(s["t"], s[key]) for s in samples if key in s]
        for (_, a), (t, b) in zip(seen, seen[1:]):
            if b > a:
                marks.append({"t": t, "kind": kind, "blocks": b - a})
    return sorted(marks, key=lambda m: (m["t"], m["kind"]))


def join_timeline(records: Sequence[RequestRecord], windows: Sequence[PrefillWindow],
                  samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    samples = sorted(samples, key=lambda s: s["t"])
    times = [s["t"] for s in samples]
    return {
        "kv_events": kv_events(samples),
        "windows": [window_state(samples, w) for w in windows] if samples else [],
        "requests": [
            {
                "index": r.index,
                "at_send": state_at(samples, times, r.send_time),
                "at_first_token": state_at(samples, times, r.first_token_time),
            }
            for r in records
        ] if samples else [],
    }
