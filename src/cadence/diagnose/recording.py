"""What `cadence diagnose` reads, in one shape: requests with their token times, and the
engine's steps when the source has them.

Three sources:
- a `cadence serve --trace` JSONL file (steps, requests, the settings in its meta line);
- a `cadence bench --out` result.json (client-side times only: send, every streamed chunk);
- a running server's `/dashboard/events` stream, read for a while (`scrape`).
All times are seconds on the source's own clock; nothing compares clocks across sources.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.telemetry.trace_writer import read_trace


@dataclass
class RequestRec:
    req_id: str
    prompt_tokens: int
    arrival: float
    first_token: float | None
    token_times: list[float]
    output_tokens: int
    first_scheduled: float | None = None  # engine sources only
    kind: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def prefill_time(self) -> float | None:
        if self.first_scheduled is None or self.first_token is None:
            return None
        return self.first_token - self.first_scheduled

    @property
    def gaps(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class Recording:
    source: str  # "trace" | "bench" | "server"
    name: str
    requests: list[RequestRec]
    steps: list[dict[str, Any]] = field(default_factory=list)
    # The scheduler settings it ran under, when the source says (policy, max_num_batched_tokens,
    # target_itl_ms, ...).
    settings: dict[str, Any] = field(default_factory=dict)
    target_itl_s: float | None = None
    # Cores the engine computed on, when the source says (a trace's meta line).
    num_cores: int | None = None

    @property
    def t0(self) -> float:
        return min((r.arrival for r in self.requests), default=0.0)


def load(source: str, run: int = 0) -> Recording:
    """A trace file or a bench result.json (by content, not by name)."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"{source}: no such file (give a --trace JSONL file, a bench "
                         "result.json or a server URL)")
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith("{") and '"schema_version"' in head and '"runs"' in head:
        return _from_bench(path, run)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return _from_trace(path)
    if isinstance(data, dict) and "runs" in data:
        return _from_bench(path, run)
    return _from_trace(path)


def _from_trace(path: Path) -> Recording:
    steps, requests, meta = [], [], {}
    for r in read_trace(path):
        kind = r.get("type")
        if kind == "step":
            steps.append(r)
        elif kind == "request":
            if not r.get("token_times"):
                continue
            requests.append(RequestRec(
                req_id=r["req_id"], prompt_tokens=int(r.get("num_prompt_tokens") or 0),
                arrival=float(r["arrival_time"]), first_token=r.get("first_token_time"),
                token_times=list(r["token_times"]),
                output_tokens=int(r.get("num_output_tokens") or len(r["token_times"])),
                first_scheduled=r.get("first_scheduled_time")))
        elif kind == "meta":
            meta = r
    if not requests:
        raise ValueError(f"{path}: no finished request with tokens in this trace (was it "
                         "written by `cadence serve --trace`?)")
    settings = dict(meta.get("scheduler") or {})
    target = meta.get("target_itl_s")
    cores = meta.get("num_cores")
    return Recording("trace", path.name, requests, steps, settings,
                     float(target) if target else None,
                     int(cores) if isinstance(cores, int) and cores > 0 else None)


def _from_bench(path: Path, run: int) -> Recording:
    data = json.loads(path.read_text(encoding="utf-8"))
    runs = data.get("runs") or []
    if not runs:
        raise ValueError(f"{path}: a bench result without runs")
    if not 0 <= run < len(runs):
        raise ValueError(f"{path}: --run {run} out of range (the file has {len(runs)} runs)")
    chosen = runs[run]
    requests = []
    for rec in chosen["records"]:
        if rec.get("status") != "ok":
            continue
        times = [t for t, k in zip(rec["chunk_times"], rec["chunk_tokens"]) if k > 0]
        if not times:
            continue
        requests.append(RequestRec(
            req_id=f"#{rec['index']}", prompt_tokens=int(rec["prompt_tokens"]),
            arrival=float(rec["send_time"]), first_token=times[0], token_times=times,
            output_tokens=int(rec.get("usage_completion_tokens") or sum(rec["chunk_tokens"])),
            kind=rec.get("kind", "")))
    if not requests:
        raise ValueError(f"{path}: no successful request in run {run}")
    server = data.get("server") or {}
    settings = {k: v for k, v in (server.get("settings") or {}).items()}
    return Recording("bench", f"{path.name} ({chosen.get('label', run)})", requests, [], settings)


def scrape(url: str, duration_s: float, api_key: str | None = None) -> Recording:
    """Read a cadence server's /dashboard/events for `duration_s` seconds (its recent history
    comes first, in the snapshot) and rebuild the requests from the steps."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    steps: list[dict[str, Any]] = []
    finished: dict[str, dict[str, Any]] = {}
    settings: dict[str, Any] = {}
    target = None
    deadline = time.monotonic() + duration_s
    events_url = url.rstrip("/") + "/dashboard/events"
    try:
        with httpx.stream("GET", events_url, headers=headers,
                          timeout=httpx.Timeout(10.0, read=max(15.0, duration_s))) as resp:
            if resp.status_code != 200:
                raise ValueError(f"{events_url}: HTTP {resp.status_code} {resp.read()[:200]!r}")
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    msg = json.loads(line[6:])
                    events = msg.get("events", [])
                    if msg.get("kind") == "snapshot":
                        settings = dict(msg.get("settings") or {})
                        target = (msg.get("target_itl_ms") or 0) / 1000 or None
                        events = [{"kind": "step", **s} for s in msg.get("steps", [])]
                    for ev in events:
                        if ev.get("kind") == "step":
                            steps.append(ev)
                        elif ev.get("kind") == "finished":
                            finished[ev["req_id"]] = ev
                if time.monotonic() >= deadline:
                    break
    except httpx.HTTPError as exc:
        raise ValueError(f"{events_url}: {exc}") from exc
    return Recording("server", url, requests_from_steps(steps, finished), steps, settings, target)


def requests_from_steps(steps: list[dict[str, Any]],
                        finished: dict[str, dict[str, Any]]) -> list[RequestRec]:
    """Token times from each step's sampled ids; arrival from the finished record's TTFT when
    there is one (else the first prefill step's start: queueing unknown)."""
    tokens: dict[str, list[float]] = {}
    first_sched: dict[str, float] = {}
    prompt: dict[str, int] = {}
    for s in sorted(steps, key=lambda s: s["t_end"]):
        for rid, _, p in zip(s.get("prefill_req_ids", ()), s.get("prefill_chunk_tokens", ()),
                             s.get("prefill_prompt_tokens", ())):
            first_sched.setdefault(rid, s["t_start"])
            prompt[rid] = int(p)
        for rid in s.get("sampled_req_ids", ()):
            tokens.setdefault(rid, []).append(s["t_end"])
    out = []
    for rid, times in tokens.items():
        if rid not in first_sched:
            continue  # its prefill happened before the window: its TTFT is unknown
        fin = finished.get(rid, {})
        ttft = fin.get("ttft")
        arrival = times[0] - ttft if ttft is not None else first_sched[rid]
        out.append(RequestRec(rid, int(fin.get("num_prompt_tokens") or prompt.get(rid, 0)),
                              arrival, times[0], times, len(times), first_sched[rid]))
    return out
