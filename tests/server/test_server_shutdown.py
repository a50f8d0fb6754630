"""SIGTERM/SIGINT: in-flight streams end with an explicit reason; the engine process exits."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from cadence.server.proc_stat import child_pids, is_running
from server_harness import fake_engine_args, start_server


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_aborts_in_flight_streams_with_reason(tmp_path, sig):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=4096, step_delay_s=0.02),
                          "--shutdown-grace-seconds", "0.5")
    engine_pids = child_pids(server.proc.pid)
    assert engine_pids, "the engine runs in its own process"
    events: dict[int, list[str]] = {}
    first_chunk = threading.Barrier(4, timeout=30)

    def stream(i: int) -> None:
        body = {"prompt": f"stream {i}", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        lines = events.setdefault(i, [])
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body,
                          timeout=60) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 1:
                        first_chunk.wait()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    first_chunk.wait()
    t0 = time.monotonic()
    server.proc.send_signal(sig)
    for t in threads:
        t.join(30)
    # uvicorn re-raises the signal once shut down: death by that signal is a clean exit.
    assert server.proc.wait(30) in (0, -sig)
    assert time.monotonic() - t0 < 20
    for i in range(3):
        lines = events[i]
        assert lines[-1] == "[DONE]"
        last = json.loads(lines[-2])
        assert last["choices"][0]["finish_reason"] == "abort"
    deadline = time.monotonic() + 60
    while any(is_running(p) for p in engine_pids):
        assert time.monotonic() < deadline, "engine process outlived the server"
        time.sleep(0.1)


def test_engine_crash_ends_streams_with_error_then_recovers(tmp_path):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=4096, step_delay_s=0.02))
    try:
        body = {"prompt": "survivor", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body,
                          timeout=60) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            crash = httpx.post(server.base_url + "/v1/completions",
                               json={"prompt": "CRASH", "max_tokens": 5}, timeout=30)
            assert crash.status_code == 503
            assert crash.json()["error"]["code"] == "engine_unavailable"
            assert int(crash.headers["retry-after"]) >= 1
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]"
        assert json.loads(rest[-2])["error"]["code"] == "engine_unavailable"
        # The supervisor respawns the engine: the service answers again.
        deadline = time.monotonic() + 30
        while True:
            health = httpx.get(server.base_url + "/health", timeout=5)
            if health.status_code == 200:
                break
            assert health.headers["retry-after"]
            assert time.monotonic() < deadline, "the engine never came back"
            time.sleep(0.1)
        after = httpx.post(server.base_url + "/v1/completions",
                           json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert after.status_code == 200, after.text
    finally:
        server.stop()


def test_in_process_engine_serves_and_stops(tmp_path):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=256),
                          "--in-process-engine")
    try:
        assert child_pids(server.proc.pid) == []  # the engine is a thread here
        resp = httpx.post(server.base_url + "/v1/completions",
                          json={"prompt": "hello", "max_tokens": 4, "temperature": 0}, timeout=30)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
    finally:
        assert server.stop() in (0, -signal.SIGTERM)


def test_engine_exits_when_the_server_is_killed_mid_stream(tmp_path):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=4096, step_delay_s=0.02))
    engine_pids = child_pids(server.proc.pid)
    body = {"prompt": "orphan", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as resp:
        next(resp.iter_lines())  # the engine is busy stepping this request
        server.proc.kill()
        server.proc.wait(10)
    deadline = time.monotonic() + 60
    while any(is_running(p) for p in engine_pids):
        assert time.monotonic() < deadline, "orphaned engine process kept running"
        time.sleep(0.1)
