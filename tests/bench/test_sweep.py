"""`cadence sweep` on fake servers: grid, Pareto front, SLO choice, outputs; the subprocess
launcher on tiny stand-in commands."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

import pytest

from cadence.bench.config import AnalysisConfig, BenchConfig, ClientConfig, SLOConfig, WorkloadConfig
from cadence.bench.schema import validate_sweep
from cadence.bench.server_process import ServerProcess, ServerStartError, ServeSetting, free_port, serve_command
from cadence.bench.sweep import SweepConfig, run_sweep
from cadence.bench.sweep_analysis import choose_setting, pareto_front

from .fake_server import FakeServer, FakeServerConfig

pytestmark = pytest.mark.timeout(120)


def test_grid_skips_meaningless_settings():
    grid = SweepConfig(policies=("eager", "chunked"), budgets=(64, 256), chunk_caps=(0, 128)).settings()
    assert [s.name for s in grid] == ["eager-b64", "eager-b256", "chunked-b64", "chunked-b256", "chunked-b256-c128"]
    with pytest.raises(ValueError, match="unknown policies"):
        SweepConfig(policies=("greedy",))


def test_serve_command_uses_the_cadence_serve_flags():
    cmd = serve_command(ServeSetting("chunked", 256, 64), 8123, ("--max-num-seqs", "8"))
    assert cmd[:4] == [sys.executable, "-m", "cadence.cli", "serve"]
    joined = " ".join(cmd)
    for part in ("--port 8123", "--policy chunked", "--max-num-batched-tokens 256",
                 "--long-prefill-token-threshold 64", "--max-num-seqs 8"):
        assert part in joined


def _row(name, x, y, tps, p99=None, failed=0):
    return {"name": name, "status": "ok", "x_ttft_long_p50": x, "y_itl_interfered_p99": y, "output_tps": tps,
            "failed_requests": failed, "p99": p99 or {"ttft": x, "itl": y, "tpot": None, "e2e": None}}


def test_pareto_front_and_choice():
    rows = [_row("a", 1.0, 0.5, 10), _row("b", 2.0, 0.1, 8), _row("c", 2.5, 0.6, 12), _row("d", 1.0, 0.5, 9),
            {"name": "dead", "status": "failed", "error": "x"}]
    assert pareto_front(rows) == ["a", "d", "b"]  # c is beaten by a on both axes; ties kept
    meets = choose_setting(rows, {"ttft": 3.0, "itl": 0.55})
    assert meets["name"] == "a" and meets["meets_slo"]  # a, b, d meet; a has the most throughput
    closest = choose_setting(rows, {"ttft": 1.5, "itl": 0.05})
    assert closest["name"] == "b" and not closest["meets_slo"]  # worst ratio 2.0 (b) < 10 (a)
    assert choose_setting(rows, {})["name"] == "c"
    assert choose_setting([{"name": "dead", "status": "failed"}], {}) is None


def _fake_launch(setting, port, log_path):
    @contextmanager
    def launched():
        cfg = FakeServerConfig(policy=setting.policy, budget=setting.max_num_batched_tokens,
                               decode_step_s=0.02, prefill_s_per_token=0.0005)
        with FakeServer(cfg) as srv:
            yield srv
    return launched()


def test_sweep_on_fake_servers_maps_the_trade_off(tmp_path):
    # Simulated costs are chosen so that the effects (a 0.5 s eager stall against 0.05 s chunked
    # steps; 0.85 s against 0.52 s document TTFT) dwarf scheduling noise on a busy machine. Only
    # comparisons and sleep-bounded lower limits are asserted, never absolute speeds.
    base = BenchConfig(
        client=ClientConfig(url="http://unused"),
        workload=WorkloadConfig(name="doc-burst", num_streams=3, num_docs=1, long_tokens=1000, short_tokens=(8, 12),
                                output_tokens=(40, 40), doc_output_tokens=2, doc_delay_s=0.0),
        analysis=AnalysisConfig(slo=SLOConfig.parse("ttft=5,itl=0.3")),
        use_tokenizer=False, progress=False, metrics_interval_s=0.1,
    )
    result = run_sweep(base, SweepConfig(policies=("eager", "chunked"), budgets=(64, 1024)), str(tmp_path),
                       launch=_fake_launch)
    validate_sweep(result)
    rows = {r["name"]: r for r in result["settings"]}
    assert set(rows) == {"eager-b64", "eager-b1024", "chunked-b64", "chunked-b1024"}
    assert all(r["status"] == "ok" and r["x_source"] == "long prompts" for r in rows.values())
    # Eager stalls the streams for the whole prefill (a sleep: a lower bound); chunked with a 64-token
    # budget keeps gaps near one small step, and the document waits longer for its first token.
    assert rows["eager-b1024"]["y_itl_interfered_p99"] >= 0.4  # ~900 whitespace words x 0.5 ms
    assert rows["chunked-b64"]["y_itl_interfered_p99"] < rows["eager-b1024"]["y_itl_interfered_p99"]
    assert rows["chunked-b64"]["x_ttft_long_p50"] > rows["eager-b1024"]["x_ttft_long_p50"]
    assert "chunked-b64" in result["pareto"]
    assert result["choice"]["name"] == "chunked-b64" and result["choice"]["meets_slo"]
    for name in ("sweep.json", "sweep.md", "sweep_map.png", "chunked-b64/result.json", "eager-b64/timeline.png"):
        assert os.path.getsize(tmp_path / name) > 0, name
    with open(tmp_path / "sweep.json") as f:
        validate_sweep(json.load(f))
    shas = []
    for name in rows:
        with open(tmp_path / name / "result.json") as f:
            shas.append([r["prompt_sha1"] for r in json.load(f)["runs"][0]["records"]])
    assert all(s == shas[0] for s in shas)  # the same requests under every setting
    assert "Chosen: **chunked-b64**" in (tmp_path / "sweep.md").read_text()


def test_sweep_records_a_server_that_fails_to_start(tmp_path):
    def failing_launch(setting, port, log_path):
        cmd = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
        return ServerProcess(cmd, port, log_path, startup_timeout_s=30)

    base = BenchConfig(client=ClientConfig(url="http://unused"), use_tokenizer=False, progress=False)
    result = run_sweep(base, SweepConfig(policies=("eager",), budgets=(64,)), str(tmp_path), launch=failing_launch)
    (row,) = result["settings"]
    assert row["status"] == "failed" and "no model here" in row["error"] and "code 3" in row["error"]
    assert result["choice"] is None and result["pareto"] == []
    assert os.path.exists(tmp_path / "sweep_map.png")
    # Without --out the server log goes to a temporary folder, not the working directory.
    cwd_before = set(os.listdir("."))
    again = run_sweep(base, SweepConfig(policies=("eager",), budgets=(64,)), None, launch=failing_launch)
    assert "no model here" in again["settings"][0]["error"]
    assert set(os.listdir(".")) == cwd_before


_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_process_waits_for_health_and_stops(tmp_path):
    port = free_port()
    with ServerProcess([sys.executable, "-c", _HEALTH_SERVER, str(port)], port, str(tmp_path / "log"), 30) as srv:
        assert srv.proc.poll() is None
        assert srv.url == f"http://127.0.0.1:{port}"
    assert srv.proc.poll() is not None


def test_server_process_times_out_with_a_clear_error(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('still loading'); time.sleep(60)"]
    with pytest.raises(ServerStartError, match="not healthy after 1 s"):
        with ServerProcess(cmd, free_port(), str(tmp_path / "log"), startup_timeout_s=1.0):
            pass
