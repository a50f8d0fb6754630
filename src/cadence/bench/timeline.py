"""Join the server's /metrics samples onto the client's timeline.

Both share the run's clock (seconds since its start), so each long prefill window gets the
server state seen during it (peak running/waiting/KV usage, preemptions), and each request the
state last scraped before it was sent and before its first token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from cadence.bench.interference import PrefillWindow
from cadence.bench.records import RequestRecord

_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")


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
    return out


def join_timeline(records: Sequence[RequestRecord], windows: Sequence[PrefillWindow],
                  samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    samples = sorted(samples, key=lambda s: s["t"])
    times = [s["t"] for s in samples]
    return {
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
