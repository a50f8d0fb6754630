"""A dead engine comes back (issue 13): kill -9 of the engine process while streams run.

In-flight requests end with an explicit error, new ones get 503 with Retry-After until the
supervisor has respawned the engine, the gauges drop to zero with the dead engine, and the
service answers again well within 30 s. With --exit-on-engine-death the server exits non-zero
instead (for a supervisor that restarts whole processes).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx

from cadence.server.proc_stat import child_pids, is_running
from server_harness import fake_engine_args, start_server


def _stream(server, i: int, events: dict[int, list[str]], started: threading.Semaphore) -> None:
    body = {"prompt": f"stream {i}", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    lines = events.setdefault(i, [])
    try:
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body,
                          timeout=60) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 1:
                        started.release()
    except httpx.HTTPError as exc:
        lines.append(f"transport error: {exc}")


def _engine_pid(server) -> int:
    pids = [p for p in child_pids(server.proc.pid) if is_running(p)]
    assert len(pids) == 1, pids
    return pids[0]


def test_kill_9_engine_mid_streams_respawns(tmp_path):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=4096, step_delay_s=0.02))
    try:
        old_pid = _engine_pid(server)
        events: dict[int, list[str]] = {}
        started = threading.Semaphore(0)
        threads = [threading.Thread(target=_stream, args=(server, i, events, started))
                   for i in range(4)]
        for t in threads:
            t.start()
        for _ in threads:
            assert started.acquire(timeout=30)
        assert server.metrics()["cadence:num_requests_running"] == 4
        os.kill(old_pid, signal.SIGKILL)
        t0 = time.monotonic()
        for t in threads:
            t.join(20)
            assert not t.is_alive(), "a stream hung after the engine died"
        for lines in events.values():
            assert lines[-1] == "[DONE]", lines[-3:]
            assert json.loads(lines[-2])["error"]["code"] == "engine_unavailable"
        saw_503 = False
        while True:
            resp = httpx.post(server.base_url + "/v1/completions", timeout=10,
                              json={"prompt": "back?", "max_tokens": 2, "temperature": 0})
            if resp.status_code == 200:
                break
            assert resp.status_code == 503, resp.text
            assert int(resp.headers["retry-after"]) >= 1
            saw_503 = True
            assert time.monotonic() - t0 < 30, "the service did not answer again within 30 s"
            time.sleep(0.05)
        recovered_s = time.monotonic() - t0
        new_pid = _engine_pid(server)
        assert new_pid != old_pid
        m = server.metrics()
        assert m["cadence:engine_restarts_total"] == 1 and m["cadence:engine_up"] == 1
        assert m["cadence:num_requests_running"] == 0
        assert m["cadence:kv_cache_blocks_used"] == 0
        print(f"recovered in {recovered_s:.1f}s (saw 503 meanwhile: {saw_503})")
    finally:
        server.stop()
    assert not is_running(old_pid)


def test_exit_on_engine_death_exits_non_zero(tmp_path):
    server = start_server(str(tmp_path), *fake_engine_args(max_model_len=256),
                          "--exit-on-engine-death")
    try:
        engine = _engine_pid(server)
        os.kill(engine, signal.SIGKILL)
        code = server.proc.wait(30)
        assert code not in (0, None), code
        assert "exit-on-engine-death" in server.log()
    finally:
        server.stop()
