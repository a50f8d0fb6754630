"""Drive one workload against a server under one arrival process and collect the records."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cadence.bench.arrivals import send_offsets
from cadence.bench.client import stream_request
from cadence.bench.config import ArrivalConfig, BenchConfig
from cadence.bench.metrics_scraper import MetricsScraper
from cadence.bench.records import RequestRecord
from cadence.bench.workloads import RequestSpec, Workload


@dataclass
class RunOutcome:
    """The raw result of one run: records in request order plus server-side samples."""

    label: str
    arrival: dict[str, Any]
    duration_s: float
    records: list[RequestRecord]
    server_metrics: dict[str, Any] = field(default_factory=dict)


def make_progress(enabled: bool) -> Progress | None:
    if not enabled:
        return None
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tokens]} tok"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


async def run_workload(
    http: httpx.AsyncClient,
    cfg: BenchConfig,
    model: str,
    workload: Workload,
    arrival: ArrivalConfig,
    label: str,
    progress: Progress | None = None,
    description: str | None = None,
) -> RunOutcome:
    """Send every request of `workload` as `arrival` says; return when all have ended.
    `description` names the progress bar (default: the label)."""
    specs = list(workload.requests)
    t0 = time.perf_counter()
    records: dict[int, RequestRecord] = {}
    task_id = (progress.add_task(description or label, total=len(specs), tokens=0)
               if progress else None)
    seen_tokens = [0]
    progressed = _Progressed()

    def on_chunk(rec: RequestRecord) -> None:
        seen_tokens[0] += rec.chunk_tokens[-1]
        progressed.mark(rec.index)
        if progress is not None:
            progress.update(task_id, tokens=seen_tokens[0])

    async def send(spec: RequestSpec) -> RequestRecord:
        rec = await stream_request(http, cfg.client, model, spec, t0, on_chunk)
        records[spec.index] = rec
        progressed.mark(spec.index)
        if progress is not None:
            progress.advance(task_id)
        return rec

    scraper = None
    if cfg.metrics_interval_s > 0:
        scraper = MetricsScraper(http, cfg.client.url, cfg.metrics_interval_s, t0)
        scrape_task = asyncio.create_task(scraper.run())
    try:
        if arrival.kind == "concurrency":
            await _closed_loop(specs, arrival.concurrency, send)
        elif arrival.kind == "script":
            await _script(specs, workload, send, progressed)
        else:
            offsets = send_offsets(len(specs), arrival.rate, 1.0 if arrival.kind == "poisson" else arrival.burstiness, arrival.seed)
            await _open_loop(specs, offsets, t0, send)
    finally:
        if scraper is not None:
            await scraper.stop()
            await scrape_task
    ordered = [records[s.index] for s in specs]
    duration = max((r.end_time or 0.0) for r in ordered) - min(r.send_time for r in ordered)
    return RunOutcome(
        label=label,
        arrival=_describe_arrival(arrival, workload),
        duration_s=duration,
        records=ordered,
        server_metrics=scraper.to_json() if scraper else {"available": False, "note": "scraping disabled", "interval_s": 0.0, "samples": []},
    )


async def _closed_loop(specs: list[RequestSpec], concurrency: int, send) -> None:
    queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)

    async def worker() -> None:
        while True:
            try:
                spec = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await send(spec)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(specs)))))


async def _open_loop(specs: list[RequestSpec], offsets: list[float], t0: float, send) -> None:
    tasks = []
    for spec, offset in zip(specs, offsets):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(spec)))
    await asyncio.gather(*tasks)


@dataclass
class _Progressed:
    """Which requests have a first token or have ended; `changed` is set on every change."""

    started: set[int] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def mark(self, index: int) -> None:
        if index not in self.started:
            self.started.add(index)
            self.changed.set()

    async def wait_all(self, indices: list[int]) -> None:
        while not all(i in self.started for i in indices):
            self.changed.clear()
            await self.changed.wait()


async def _script(specs: list[RequestSpec], workload: Workload, send, progressed: _Progressed) -> None:
    """Phase by phase: every request of a phase is sent at once; the next phase starts
    `script_delay_s` after all of the previous phase is decoding (has a first token) or has ended,
    its requests `script_gap_s` apart."""
    phases = sorted({s.phase for s in specs})
    tasks: list[asyncio.Task] = []
    for n, phase in enumerate(phases):
        members = [s for s in specs if s.phase == phase]
        for i, spec in enumerate(members):
            if n > 0 and i > 0 and workload.script_gap_s > 0:
                await asyncio.sleep(workload.script_gap_s)
            tasks.append(asyncio.create_task(send(spec)))
        if n + 1 < len(phases):
            await progressed.wait_all([s.index for s in members])
            if workload.script_delay_s > 0:
                await asyncio.sleep(workload.script_delay_s)
    await asyncio.gather(*tasks)


def _describe_arrival(arrival: ArrivalConfig, workload: Workload) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": arrival.kind}
    if arrival.kind == "concurrency":
        out["concurrency"] = arrival.concurrency
    elif arrival.kind in ("poisson", "gamma", "sweep"):
        out["rate"] = arrival.rate
        out["burstiness"] = 1.0 if arrival.kind == "poisson" else arrival.burstiness
        out["seed"] = arrival.seed
    else:
        out["delay_s"] = workload.script_delay_s
        out["gap_s"] = workload.script_gap_s
    return out
