"""Periodic /metrics scrapes during a run, for the server-side half of the timeline.

Parsed with prometheus_client's text parser. Names are matched after their namespace prefix, so
cadence (`cadence:kv_cache_usage_perc`) and vLLM (`vllm:kv_cache_usage_perc`) both work; values
of one name are summed over label sets (e.g. one per model).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# timeline key -> sample-name suffixes accepted (after "<namespace>:")
TRACKED = {
    "kv_cache_usage_perc": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "num_requests_running": ("num_requests_running",),
    "num_requests_waiting": ("num_requests_waiting",),
    "num_preemptions_total": ("num_preemptions_total", "num_preemptions"),
    # KV offload (cadence): swaps to the host and disk tiers, prefix-cache spills and reloads.
    "num_swap_preemptions_total": ("num_swap_preemptions_total",),
    "kv_blocks_swapped_out_total": ("kv_blocks_swapped_out_total",),
    "kv_blocks_swapped_in_total": ("kv_blocks_swapped_in_total",),
    "kv_blocks_swapped_out_disk_total": ("kv_blocks_swapped_out_disk_total",),
    "kv_blocks_swapped_in_disk_total": ("kv_blocks_swapped_in_disk_total",),
    "prefix_cache_blocks_spilled_total": ("prefix_cache_blocks_spilled_total",),
    "prefix_cache_blocks_reloaded_total": ("prefix_cache_blocks_reloaded_total",),
    "kv_offload_failures_total": ("kv_offload_failures_total",),
}


def parse_metrics(text: str) -> dict[str, float]:
    """The tracked values in one /metrics body; names absent from it are left out."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            suffix = sample.name.rsplit(":", 1)[-1]
            for key, names in TRACKED.items():
                if suffix in names:
                    found[key] = found.get(key, 0.0) + float(sample.value)
    return found


@dataclass
class MetricsScraper:
    """Scrape `url`/metrics every `interval_s` until stopped; samples are {"t": s since t0, ...}."""

    http: httpx.AsyncClient
    url: str
    interval_s: float
    t0: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    available: bool = True
    note: str = ""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def scrape_once(self) -> bool:
        try:
            resp = await self.http.get(self.url.rstrip("/") + "/metrics", timeout=5.0)
        except httpx.HTTPError as exc:
            self.note = f"scrape failed: {type(exc).__name__}: {exc}"
            return True  # transient: keep trying
        if resp.status_code != 200:
            self.available = False
            self.note = f"/metrics answered HTTP {resp.status_code}; not scraped"
            return False
        try:
            values = parse_metrics(resp.text)
        except Exception as exc:  # the parser raises assorted errors on non-Prometheus bodies

            self.available = False
            self.note = f"/metrics is not Prometheus text: {exc}"
            return False
        if not values and not self.samples:
            self.note = "/metrics has none of the tracked metrics"
        self.samples.append({"t": time.perf_counter() - self.t0, **values})
        return True

    async def run(self) -> None:
        while not self._stop.is_set():
            if not await self.scrape_once():
                return
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        """Stop after one last scrape (so the run's end state is recorded)."""
        self._stop.set()
        if self.available:
            await self.scrape_once()

    def to_json(self) -> dict[str, Any]:
        return {"available": self.available and bool(self.samples), "note": self.note,
                "interval_s": self.interval_s, "samples": self.samples}
