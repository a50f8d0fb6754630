"""`cadence bench --workload doc-burst` against a live `cadence serve` on the default model."""

from __future__ import annotations

import json

import pytest

from cadence.bench.schema import validate_result
from cadence.bench.server_process import ServerProcess, ServeSetting, free_port, serve_command
from cadence.cli import main as cadence_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cadence_server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = serve_command(ServeSetting("chunked", 128), port, ("--log-level", "warning", "--max-num-seqs", "8"))
    with ServerProcess(cmd, port, str(log), startup_timeout_s=180) as server:
        yield server


def test_doc_burst_against_cadence(cadence_server, tmp_path):
    rc = cadence_main([
        "bench", "--url", cadence_server.url, "--workload", "doc-burst", "--streams", "2", "--docs", "1",
        "--long-tokens", "256", "--short-tokens", "8:16", "--output-tokens", "16", "--doc-output-tokens", "4",
        "--doc-delay", "0", "--slo", "ttft=5,itl=2", "--metrics-interval", "0.2", "--no-progress",
        "--out", str(tmp_path),
    ])
    assert rc == 0
    with open(tmp_path / "result.json") as f:
        result = json.load(f)
    validate_result(result)
    run = result["runs"][0]
    m = run["metrics"]
    assert m["requests"] == {"total": 3, "ok": 3, "failed": 0}, m["failures"]
    # Exact lengths from the default model's tokenizer, and the server counts the same.
    assert result["workload"]["tokens_exact"]
    assert m["token_counting"]["prompt_tokens_mismatch_requests"] == []
    assert all(r["usage_completion_tokens"] == r["max_tokens"] for r in run["records"])  # ignore_eos honoured
    assert m["interference"]["windows"] and m["interference"]["ttft_long"]["count"] == 1
    assert run["server_metrics"]["available"]
    assert any("kv_cache_usage_perc" in s for s in run["server_metrics"]["samples"])
    for name in ("summary.md", "itl_cdf.png", "ttft_by_bucket.png", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_real_tokenizer_gives_exact_lengths():
    from cadence.bench.config import WorkloadConfig
    from cadence.bench.token_counter import load_token_counter
    from cadence.bench.workloads import build_workload

    counter = load_token_counter()
    assert counter.exact, counter.source
    for name in ("chat", "rag", "coding", "doc-burst", "mix"):
        w = build_workload(WorkloadConfig(name=name, num_requests=6, long_tokens=512), counter)
        assert all(counter.count(r.prompt) == r.prompt_tokens for r in w.requests), name
