"""`cadence bench` end to end against the fake streaming server: JSON valid, plots written,
failures and interference seen where the fake server puts them."""

from __future__ import annotations

import json
import os

import pytest

from cadence.bench.bench import BenchError, run_bench
from cadence.bench.config import AnalysisConfig, ArrivalConfig, BenchConfig, ClientConfig, SLOConfig, WorkloadConfig
from cadence.bench.schema import validate_result
from cadence.cli import main as cadence_main

from .fake_server import FakeServer, FakeServerConfig

pytestmark = pytest.mark.timeout(120)


def _cfg(url, workload, arrival=ArrivalConfig(), **kw) -> BenchConfig:
    return BenchConfig(client=ClientConfig(url=url), workload=workload, arrival=arrival, use_tokenizer=False,
                       progress=False, metrics_interval_s=0.05,
                       analysis=AnalysisConfig(slo=SLOConfig.parse("ttft=0.5,itl=0.1")), **kw)


def test_doc_burst_detects_interference_and_failures(tmp_path):
    fake = FakeServerConfig(decode_step_s=0.004, prefill_s_per_token=0.0002, reject_arrivals=(1,), cut_arrivals=(2,))
    # Streams decode 100 tokens (>= 0.4 s), far longer than the 0.03 s before the document is sent.
    wl = WorkloadConfig(name="doc-burst", num_streams=5, num_docs=1, long_tokens=800, short_tokens=(8, 16),
                        output_tokens=(100, 100), doc_output_tokens=4, doc_delay_s=0.03)
    with FakeServer(fake) as srv:
        result = run_bench(_cfg(srv.url, wl), str(tmp_path))
    validate_result(result)
    for name in ("result.json", "summary.md", "itl_cdf.png", "ttft_by_bucket.png", "timeline.png"):
        assert os.path.getsize(tmp_path / name) > 0, name
    with open(tmp_path / "result.json") as f:
        validate_result(json.load(f))
    run = result["runs"][0]
    m = run["metrics"]
    assert run["arrival"]["kind"] == "script"
    assert m["requests"] == {"total": 6, "ok": 4, "failed": 2}
    fails = {f["index"]: f for f in m["failures"]["requests"]}
    assert fails[1]["kind"] == "http" and fails[1]["http_status"] == 400
    assert "rejected" in fails[1]["message"]
    assert fails[2]["kind"] == "stream_cut" and fails[2]["tokens_received"] >= 1
    inter = m["interference"]
    doc = next(r for r in run["records"] if r["kind"] == "document")
    assert [w["index"] for w in inter["windows"]] == [doc["index"]]
    # The document was sent while the streams decoded, so every surviving stream is interfered
    # and its worst gap is at least the document's 160 ms prefill step (a sleep: a lower bound).
    assert inter["interfered_requests"] == [0, 3, 4]
    assert inter["itl_interfered"]["max"] > 0.12
    assert inter["itl_in_windows"]["max"] > 0.12
    assert m["goodput"]["good_requests"] < 4  # the stall breaks the 100 ms ITL SLO
    assert run["server_metrics"]["available"] and len(run["server_metrics"]["samples"]) >= 2
    assert any("num_requests_running" in s for s in run["server_metrics"]["samples"])
    (window,) = run["timeline"]["windows"]
    assert window["index"] == doc["index"] and window["samples"] >= 1
    assert window["preemptions"] == 0
    assert not result["workload"]["tokens_exact"]
    assert "APPROXIMATE" in (tmp_path / "summary.md").read_text()


def test_multi_token_chunks_are_counted_as_sent(tmp_path):
    with FakeServer(FakeServerConfig(tokens_per_chunk=3, metrics=False)) as srv:
        wl = WorkloadConfig(name="chat", num_requests=3, output_tokens=(7, 7))
        result = run_bench(_cfg(srv.url, wl, ArrivalConfig(kind="concurrency", concurrency=3)), None)
    run = result["runs"][0]
    m = run["metrics"]
    assert all(r["chunk_tokens"] == [3, 3, 1] for r in run["records"])
    assert all(r["counted_by_logprobs"] and r["usage_completion_tokens"] == 7 for r in run["records"])
    assert m["token_counting"]["multi_token_chunks"] == 6
    assert m["token_counting"]["usage_mismatch_requests"] == []
    assert m["itl"]["count"] == 3 * 6 and m["itl"]["min"] == 0.0
    assert not run["server_metrics"]["available"]


def test_rate_sweep_gives_one_run_per_rate():
    with FakeServer() as srv:
        wl = WorkloadConfig(name="mix", num_requests=6, short_tokens=(4, 16), long_tokens=64, output_tokens=(3, 5))
        result = run_bench(_cfg(srv.url, wl, ArrivalConfig(kind="sweep", rates=(50.0, 200.0), burstiness=0.5)), None)
    assert [r["label"] for r in result["runs"]] == ["rate_50", "rate_200"]
    assert all(r["arrival"]["kind"] == "gamma" and r["metrics"]["requests"]["ok"] == 6 for r in result["runs"])
    # Same requests in both runs.
    assert [x["prompt_sha1"] for x in result["runs"][0]["records"]] == [x["prompt_sha1"] for x in result["runs"][1]["records"]]


def test_poisson_rag_through_the_cli(tmp_path, capsys):
    with FakeServer() as srv:
        rc = cadence_main(["bench", "--url", srv.url, "--workload", "rag", "--num-requests", "4", "--long-tokens", "60",
                           "--output-tokens", "3:6", "--arrival", "poisson", "--rate", "100", "--no-tokenizer",
                           "--no-progress", "--slo", "ttft=60,itl=60", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "ITL, interfered streams" in out
    with open(tmp_path / "result.json") as f:
        result = json.load(f)
    validate_result(result)
    assert result["server"]["model"] == "fake-model"  # learned from /v1/models
    assert result["runs"][0]["metrics"]["goodput"]["good_requests"] == 4  # generous SLOs: all meet


def test_unreachable_server_is_a_clear_error(capsys):
    cfg = _cfg("http://127.0.0.1:9", WorkloadConfig(num_requests=1))
    with pytest.raises(BenchError, match="cannot reach the server"):
        run_bench(cfg, None)
    rc = cadence_main(["bench", "--url", "http://127.0.0.1:9", "--no-tokenizer", "--no-progress", "--num-requests", "1"])
    assert rc == 2 and "cannot reach the server" in capsys.readouterr().err


def test_bad_cli_values_are_clear_errors(capsys):
    rc = cadence_main(["bench", "--url", "http://127.0.0.1:9", "--slo", "latency=1", "--no-tokenizer"])
    assert rc == 2 and "bad SLO" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cadence_main(["bench", "--url", "http://x", "--short-tokens", "9:3"])


def test_every_request_failing_still_gives_a_valid_report(tmp_path):
    with FakeServer(FakeServerConfig(reject_arrivals=tuple(range(10)))) as srv:
        wl = WorkloadConfig(name="doc-burst", num_streams=2, num_docs=1, long_tokens=50, short_tokens=(4, 8))
        result = run_bench(_cfg(srv.url, wl), str(tmp_path))
    m = result["runs"][0]["metrics"]
    assert m["requests"]["ok"] == 0 and m["failures"]["by_kind"] == {"http": 3}
    assert m["ttft"]["count"] == 0 and m["throughput"]["output_tps"] == 0.0
    for name in ("result.json", "summary.md", "itl_cdf.png", "ttft_by_bucket.png", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_non_prometheus_metrics_page_is_noted_not_fatal():
    import asyncio
    import time

    import httpx

    from cadence.bench.metrics_scraper import MetricsScraper

    def handler(request):
        return httpx.Response(200, text="<html>{not prometheus}</html>")

    async def scrape():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            s = MetricsScraper(http, "http://x", 0.01, time.perf_counter())
            await s.run()
            return s

    s = asyncio.run(scrape())
    assert not s.available and "not Prometheus" in s.note


def test_cli_rejects_bad_urls_and_unwritable_out(tmp_path, capsys):
    assert cadence_main(["bench", "--url", "ftp://host", "--no-tokenizer"]) == 2
    assert "url must start with http" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with FakeServer() as srv:
        rc = cadence_main(["bench", "--url", srv.url, "--num-requests", "1", "--output-tokens", "2", "--no-tokenizer",
                           "--no-progress", "--out", str(blocker / "sub")])
    assert rc == 2 and "error" in capsys.readouterr().err


def test_logprobs_flag_is_sent_and_used_for_counting(tmp_path):
    from cadence.bench.client import completion_body
    from cadence.bench.workloads import RequestSpec

    body = completion_body(ClientConfig(url="http://x", request_logprobs=True, ignore_eos=False), "m",
                           RequestSpec(0, "chat", "hi there", 2, 5))
    assert body["logprobs"] == 0 and "ignore_eos" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    with FakeServer(FakeServerConfig(metrics=False)) as srv:
        rc = cadence_main(["bench", "--url", srv.url, "--num-requests", "2", "--output-tokens", "3", "--logprobs",
                           "--no-tokenizer", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    with open(tmp_path / "result.json") as f:
        records = json.load(f)["runs"][0]["records"]
    assert all(r["counted_by_logprobs"] and r["chunk_tokens"] == [1, 1, 1] for r in records)
