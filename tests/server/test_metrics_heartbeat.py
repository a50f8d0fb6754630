"""Gauges stay fresh while one long engine step runs: the engine process publishes its stats
every 0.5 s from a side thread (engine_process.StatsHeartbeat), not only between steps."""

from __future__ import annotations

import threading
import time

import httpx

from server_harness import fake_engine_args, start_server


def test_running_gauge_updates_inside_a_long_step(tmp_path):
    # Every fake step sleeps 4 s: the request is admitted and its first step starts at once,
    # and nothing leaves the engine loop until that step ends.
    server = start_server(str(tmp_path), *fake_engine_args(step_delay_s=4.0))
    try:
        assert server.metrics()["cadence:num_requests_running"] == 0
        done = threading.Event()

        def send() -> None:
            httpx.post(server.v1 + "/completions", json={"prompt": "hi", "max_tokens": 1},
                       timeout=60)
            done.set()

        threading.Thread(target=send, daemon=True).start()
        # Seen before the answer came back, i.e. during the step (between steps the request
        # is not running yet or has already finished): no window of wall time to meet, which
        # a loaded host could miss.
        t0 = time.monotonic()
        seen = None
        while time.monotonic() - t0 < 60 and not done.is_set():
            if server.metrics()["cadence:num_requests_running"] == 1:
                seen = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert seen is not None and not done.is_set(), "the gauge froze during the step"
        done.wait(30)
    finally:
        server.stop()
