"""`cadence serve --disagg 1:1`: local prefill + decode worker processes and the router in front;
one request is handed off (the router's /metrics shows the decode worker's transfer), and
SIGTERM stops the router and both workers."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.disagg.procs import spawn, wait_all
from tests.disagg.test_router_e2e import PROMPTS, _complete

pytestmark = pytest.mark.timeout(600)


def test_serve_disagg_starts_workers_and_router(tiny_llama_dir, tmp_path):
    proc = spawn(str(tmp_path), "serve", "--model", tiny_llama_dir, "--dtype", "float32",
                 "--device", "cpu", "--num-kv-blocks", "512", "--block-size", "4",
                 "--disagg", "1:1", "--routing-policy", "always")
    try:
        wait_all([proc])
        text, n = _complete(proc, PROMPTS[1])
        assert n == 12 and text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the router scrapes its workers every second
            m = proc.metrics()
            moved = [v for k, v in m.items()
                     if "name=cadence:kv_transfer_bytes_total" in k and "role=decode" in k]
            if moved and moved[0] > 0:
                break
            time.sleep(0.3)
        assert moved and moved[0] > 0
        assert m["cadence_router:requests_total{route=disaggregated}"] == 1
        workers = {k.split("worker=")[1].split(",")[0].rstrip("}") for k in m if "worker=" in k}
        assert len(workers) == 2
    finally:
        proc.stop(signal.SIGTERM)
    assert proc.proc.returncode is not None
    for url in workers:  # the launcher stopped its workers
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_serve_data_parallel_starts_replicas_behind_a_cache_aware_router(tiny_llama_dir,
                                                                         tmp_path):
    proc = spawn(str(tmp_path), "serve", "--model", tiny_llama_dir, "--dtype", "float32",
                 "--device", "cpu", "--num-kv-blocks", "512", "--block-size", "4",
                 "--data-parallel-size", "2", "--routing-policy", "cache-aware")
    try:
        wait_all([proc])
        health = httpx.get(proc.url + "/health", timeout=10).json()
        workers = [w["url"] for w in health["workers"]]
        assert health["routing_policy"] == "cache-aware" and len(workers) == 2
        # The same prompt twice: the second goes where the first left its blocks.
        for _ in range(2):
            text, n = _complete(proc, PROMPTS[1])
            assert n == 12 and text
            time.sleep(0.3)  # the answer's cache events reach the router
        placed = httpx.get(proc.url + "/decisions", timeout=10).json()["decisions"]
        assert len({d["worker"] for d in placed}) == 1
        assert placed[1]["expected_cached_tokens"] > 0
    finally:
        proc.stop(signal.SIGTERM)
    assert proc.proc.returncode is not None
    for url in workers:  # the launcher stopped its replicas
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_each_launched_worker_writes_its_own_trace_file(tiny_llama_dir, tmp_path):
    from cadence.cli import build_parser
    from cadence.disagg.cli import disagg_config_from_args
    from cadence.disagg.launcher import worker_process_config, worker_specs
    from cadence.server.cli_serve import configs_from_args

    trace = str(tmp_path / "trace.jsonl")
    args = build_parser().parse_args(["serve", "--model", tiny_llama_dir, "--trace", trace,
                                      "--data-parallel-size", "3"])
    server, process = configs_from_args(args)
    disagg = disagg_config_from_args(args)
    specs = worker_specs(0, 0, server, process, disagg, num_replicas=3)
    assert [s.process.engine_config["trace_path"] for s in specs] == [
        str(tmp_path / f"trace.{i}.jsonl") for i in range(3)]
    # A lone `--role` worker keeps the path it was given.
    alone = worker_process_config(process, disagg, None)
    assert alone.engine_config["trace_path"] == trace
