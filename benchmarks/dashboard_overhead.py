"""Engine step time with and without a dashboard viewer connected (prints numbers only).

Starts `cadence serve` (default model unless --model), then runs the same steady load
(--streams streams of --tokens tokens each) in alternating phases: no viewer, then a viewer
reading /dashboard/events (a Python SSE client that decodes every message, as the page does;
--browser: the real page in headless chromium on this same host instead, which also charges
the browser's drawing to these cores), repeated --reps times. Each phase's mean engine step
time comes from /metrics (`cadence:decode_step_time_seconds` sum / count, decode steps only).

    .venv/bin/python benchmarks/dashboard_overhead.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_totals(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "cadence:decode_step_time_seconds_sum":
                total += s.value
            elif s.name == "cadence:decode_step_time_seconds_count":
                count += s.value
    return total, count


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_pid(server_pid: int) -> int:
    with open(f"/proc/{server_pid}/task/{server_pid}/children", encoding="ascii") as f:
        return int(f.read().split()[0])


def stream(base: str, model: str, i: int, tokens: int) -> None:
    body = {"model": model, "prompt": f"Write a long story about the number {i}.",
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        for _ in r.iter_lines():
            pass


def load(base: str, model: str, streams: int, tokens: int) -> None:
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda i: stream(base, model, i, tokens), range(streams)))


class SseViewer:
    def __init__(self, base: str) -> None:
        self.messages = 0
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=60))
        self._thread = threading.Thread(target=self._run, args=(base,), daemon=True)
        self._thread.start()

    def _run(self, base: str) -> None:
        try:
            with self._client.stream("GET", base + "/dashboard/events") as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        json.loads(line[6:])
                        self.messages += 1
        except (httpx.HTTPError, RuntimeError):
            pass

    def close(self) -> None:
        self._client.close()
        self._thread.join(5)


class BrowserViewer:
    def __init__(self, base: str) -> None:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))
        from browser import start_chromium

        self.driver = start_chromium()
        self.driver.get(base + "/dashboard")

    def close(self) -> None:
        self.driver.quit()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--browser", action="store_true")
    p.add_argument("--serve-arg", action="append", default=[])
    a = p.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "cadence.cli", "serve", "--port", str(port), "--log-level",
           "warning", *(["--model", a.model] if a.model else []), *a.serve_arg]
    server = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        load(base, model, a.streams, 8)  # warm-up
        results: dict[str, list[float]] = {"no viewer": [], "viewer": []}
        # Front-end CPU per engine step: what a viewer can take from the engine's cores,
        # whatever the neighbours do (the step times above move with the host's load).
        frontend: dict[str, list[float]] = {"no viewer": [], "viewer": []}
        engine = engine_pid(server.pid)
        for rep in range(a.reps):
            for name in ("no viewer", "viewer"):
                viewer = None
                if name == "viewer":
                    viewer = BrowserViewer(base) if a.browser else SseViewer(base)
                    time.sleep(1.0)
                s0, c0 = step_totals(base)
                f0, e0, t0 = cpu_seconds(server.pid), cpu_seconds(engine), time.monotonic()
                load(base, model, a.streams, a.tokens)
                f1, e1, t1 = cpu_seconds(server.pid), cpu_seconds(engine), time.monotonic()
                s1, c1 = step_totals(base)
                frontend[name].append((f1 - f0) / max(1.0, c1 - c0))
                if viewer is not None:
                    viewer.close()
                mean_ms = (s1 - s0) / max(1.0, c1 - c0) * 1000
                results[name].append(mean_ms)
                print(f"rep {rep} {name:>9}: {c1 - c0:.0f} decode steps, mean {mean_ms:.2f} ms; "
                      f"front end {f1 - f0:.2f} s CPU, engine {e1 - e0:.2f} s CPU in {t1 - t0:.1f} s",
                      flush=True)
        base_ms = statistics.median(results["no viewer"])
        with_ms = statistics.median(results["viewer"])
        kind = "headless chromium page" if a.browser else "SSE client"
        print(f"median step time: no viewer {base_ms:.2f} ms, {kind} connected {with_ms:.2f} ms "
              f"({100 * (with_ms / base_ms - 1):+.1f}%)")
        plain = statistics.median(frontend["no viewer"]) * 1000
        viewed = statistics.median(frontend["viewer"]) * 1000
        print(f"front-end CPU per engine step: no viewer {plain:.3f} ms, viewer {viewed:.3f} ms "
              f"(the viewer's extra {viewed - plain:+.3f} ms = "
              f"{100 * (viewed - plain) / base_ms:+.2f}% of the median step)")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
