"""Which streams were decoding while a long prefill ran, and what their ITL looked like.

A long request (prompt tokens >= threshold) has a prefill window [send time, first token time]
(to its end time if it failed before a first token): from the client's side, the longest the
server can have been working on its prompt. Another request is "interfered" when it was past its
first token and not finished during some window, i.e. its decode interval (first token, end)
overlaps the window. Its ITL is reported apart from the rest's, and so are the gaps that
themselves overlap a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cadence.bench.metrics import itl_gaps, summarize, token_times, ttft
from cadence.bench.records import RequestRecord


@dataclass(frozen=True)
class PrefillWindow:
    index: int  # the long request's index
    start: float
    end: float


def prefill_windows(records: Sequence[RequestRecord], long_prompt_tokens: int) -> list[PrefillWindow]:
    windows = []
    for r in records:
        if r.prompt_tokens < long_prompt_tokens:
            continue
        end = r.first_token_time if r.first_token_time is not None else r.end_time
        if end is not None:
            windows.append(PrefillWindow(r.index, r.send_time, end))
    return windows


def overlaps(a_start: float, a_end: float, w: PrefillWindow) -> bool:
    """Open-interval overlap: touching ends do not count."""
    return a_start < w.end and a_end > w.start


def is_interfered(rec: RequestRecord, windows: Sequence[PrefillWindow]) -> bool:
    first = rec.first_token_time
    if first is None or rec.end_time is None:
        return False
    return any(w.index != rec.index and overlaps(first, rec.end_time, w) for w in windows)


def gaps_in_windows(rec: RequestRecord, windows: Sequence[PrefillWindow]) -> list[float]:
    """The request's inter-token gaps whose interval overlaps another request's window."""
    times = token_times(rec)
    others = [w for w in windows if w.index != rec.index]
    return [b - a for a, b in zip(times, times[1:]) if any(overlaps(a, b, w) for w in others)]


def interference_metrics(records: Sequence[RequestRecord], long_prompt_tokens: int) -> dict[str, Any]:
    windows = prefill_windows(records, long_prompt_tokens)
    ok = [r for r in records if r.ok]
    interfered = [r for r in ok if is_interfered(r, windows)]
    interfered_ids = {r.index for r in interfered}
    others = [r for r in ok if r.index not in interfered_ids]
    long_ok = [r for r in ok if r.prompt_tokens >= long_prompt_tokens]
    short_ok = [r for r in ok if r.prompt_tokens < long_prompt_tokens]
    return {
        "long_prompt_tokens": long_prompt_tokens,
        "rule": "interfered = past its first token and not finished during some long request's "
        "prefill window [send, first token]",
        "windows": [{"index": w.index, "start": w.start, "end": w.end} for w in windows],
        "interfered_requests": sorted(interfered_ids),
        "itl_interfered": summarize(g for r in interfered for g in itl_gaps(r)),
        "itl_other": summarize(g for r in others for g in itl_gaps(r)),
        "itl_in_windows": summarize(g for r in ok for g in gaps_in_windows(r, windows)),
        "ttft_long": summarize(v for r in long_ok if (v := ttft(r)) is not None),
        "ttft_short": summarize(v for r in short_ok if (v := ttft(r)) is not None),
    }
