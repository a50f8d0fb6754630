"""The metric formulas on hand-made timestamp lists (DESIGN.md, "Metrics")."""

from __future__ import annotations

import pytest

from cadence.bench.config import AnalysisConfig, SLOConfig
from cadence.bench.metrics import (
    compute_run_metrics, e2e, goodput, itl_gaps, summarize, throughput, token_times, tpot, ttft,
    ttft_by_bucket,
)
from cadence.bench.records import Failure

from .records_factory import make_record


def test_single_token_chunks():
    rec = make_record(0, send=1.0, chunks=[(1.5, 1), (1.6, 1), (1.8, 1), (2.1, 1)], end=2.2)
    assert ttft(rec) == pytest.approx(0.5)
    assert itl_gaps(rec) == pytest.approx([0.1, 0.2, 0.3])
    assert e2e(rec) == pytest.approx(1.2)
    # TPOT = (E2E - TTFT) / (tokens - 1) = (1.2 - 0.5) / 3
    assert tpot(rec) == pytest.approx(0.7 / 3)


def test_chunk_carrying_several_tokens_gives_one_gap_and_zeros():
    # The second chunk carries 3 tokens sent together: one 0.2 s gap, then two zero gaps.
    rec = make_record(0, send=0.0, chunks=[(0.5, 1), (0.7, 3), (0.8, 1)])
    assert token_times(rec) == pytest.approx([0.5, 0.7, 0.7, 0.7, 0.8])
    assert itl_gaps(rec) == pytest.approx([0.2, 0.0, 0.0, 0.1])
    assert rec.output_tokens == 5
    assert tpot(rec) == pytest.approx((0.8 - 0.5) / 4)


def test_multi_token_first_chunk_has_zero_gaps_after_ttft():
    rec = make_record(0, send=0.0, chunks=[(0.4, 2), (0.5, 1)])
    assert ttft(rec) == pytest.approx(0.4)
    assert itl_gaps(rec) == pytest.approx([0.0, 0.1])


def test_usage_count_is_used_for_tpot_when_server_reports_more_tokens():
    rec = make_record(0, send=0.0, chunks=[(0.2, 1), (0.4, 1), (0.6, 1)], end=0.6, usage=5)
    assert rec.observed_tokens == 3 and rec.output_tokens == 5
    assert tpot(rec) == pytest.approx(0.4 / 4)
    assert len(itl_gaps(rec)) == 2  # gaps only between chunks actually seen


def test_one_token_answer_has_no_tpot_and_no_gaps():
    rec = make_record(0, send=0.0, chunks=[(0.3, 1)])
    assert tpot(rec) is None
    assert itl_gaps(rec) == []


def test_request_failing_midway_is_listed_and_left_out_of_latencies():
    good = make_record(0, send=0.0, chunks=[(0.1, 1), (0.2, 1)])
    cut = make_record(1, send=0.0, chunks=[(0.5, 1), (0.9, 1)], end=1.0,
                      failure=Failure("stream_cut", "peer closed connection"))
    rejected = make_record(2, send=0.0, chunks=[], end=0.01, failure=Failure("http", "bad prompt", 400))
    m = compute_run_metrics([good, cut, rejected], duration_s=1.0, analysis=AnalysisConfig(), long_prompt_tokens=1000)
    assert m["requests"] == {"total": 3, "ok": 1, "failed": 2}
    assert m["ttft"]["count"] == 1 and m["ttft"]["max"] == pytest.approx(0.1)
    assert m["itl"]["count"] == 1
    assert m["failures"]["by_kind"] == {"stream_cut": 1, "http": 1}
    by_index = {f["index"]: f for f in m["failures"]["requests"]}
    assert by_index[1]["tokens_received"] == 2 and by_index[1]["message"] == "peer closed connection"
    assert by_index[2]["http_status"] == 400
    assert m["throughput"]["completed"] == 1
    assert m["throughput"]["output_tokens"] == 2


def test_summarize_percentiles_and_empty():
    s = summarize([float(v) for v in range(1, 101)])
    assert s["count"] == 100 and s["max"] == 100 and s["min"] == 1
    assert s["p50"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert s["mean"] == pytest.approx(50.5)
    empty = summarize([])
    assert empty["count"] == 0 and empty["p99"] is None


def test_throughput_and_goodput():
    fast = make_record(0, send=0.0, chunks=[(0.1, 1), (0.15, 1), (0.2, 1)])
    slow_first = make_record(1, send=0.0, chunks=[(0.9, 1), (0.95, 1)])
    stalled = make_record(2, send=0.0, chunks=[(0.1, 1), (0.5, 1)])
    recs = [fast, slow_first, stalled]
    tp = throughput(recs, duration_s=2.0)
    assert tp["request_rps"] == pytest.approx(1.5) and tp["output_tps"] == pytest.approx(3.5)
    gp = goodput(recs, SLOConfig.parse("ttft=0.5,itl=0.1"), duration_s=2.0)
    assert gp["good_requests"] == 1 and gp["goodput_rps"] == pytest.approx(0.5)
    assert gp["met_per_slo"] == {"ttft": 2, "itl": 2}


def test_ttft_by_bucket():
    recs = [make_record(i, 0.0, [(0.1 * (i + 1), 1)], prompt_tokens=n) for i, n in enumerate([10, 63, 64, 300, 5000])]
    buckets = {b["bucket"]: b["ttft"] for b in ttft_by_bucket(recs, (64, 256, 1024))}
    assert buckets["0-63"]["count"] == 2
    assert buckets["64-255"]["count"] == 1 and buckets["64-255"]["max"] == pytest.approx(0.3)
    assert buckets["256-1023"]["count"] == 1
    assert buckets[">=1024"]["count"] == 1 and buckets[">=1024"]["p50"] == pytest.approx(0.5)


def test_slo_parsing_errors_are_clear():
    assert SLOConfig.parse("ttft=0.5, itl=0.1").limits() == {"ttft": 0.5, "itl": 0.1}
    assert SLOConfig.parse("").limits() == {}
    with pytest.raises(ValueError, match="NAME=SECONDS"):
        SLOConfig.parse("latency=3")
    with pytest.raises(ValueError, match="not a number"):
        SLOConfig.parse("ttft=fast")
    with pytest.raises(ValueError, match="> 0"):
        SLOConfig.parse("itl=0")
