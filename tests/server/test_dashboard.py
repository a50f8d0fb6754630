"""/dashboard against a live server: routes and auth, SSE events, stalls attributed to the
document's prefill live, on /metrics and in the trace (the timed engine: real scheduler and
engine loop, step cost known, so the cause of every stall is known)."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from dashboard_load import DOC_TOKENS, EventReader, doc_burst
from server_harness import start_server

from cadence.telemetry.attribution import CAUSE_PREFILL, attribute_trace
from cadence.telemetry.trace_writer import read_trace

KEY = "dash-key"
TARGET_MS = 250  # decode steps take ~10 ms (more on a busy host); the document's prefill 800 ms


@pytest.fixture(scope="module")
def eager_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    trace = tmp / "trace.jsonl"
    server = start_server(str(tmp), "--engine-factory", "timed_engine:build_timed_engine",
                          "--policy", "eager", "--target-itl-ms", str(TARGET_MS),
                          "--trace", str(trace), api_key=KEY)
    server.trace_path = trace
    yield server
    server.stop()


def test_pages_need_the_key_and_serve_plotly_from_the_wheel(eager_server):
    base = eager_server.base_url
    assert httpx.get(base + "/dashboard").status_code == 401
    assert httpx.get(base + "/dashboard/events").status_code == 401
    page = httpx.get(base + "/dashboard", params={"key": KEY})
    assert page.status_code == 200 and "stall-table" in page.text
    # The page's cookie authorizes its own requests (EventSource sends no header).
    cookies = page.cookies
    js = httpx.get(base + "/dashboard/plotly.min.js", cookies=cookies)
    assert js.status_code == 200 and len(js.content) > 1_000_000 and b"plotly" in js.content[:2000]
    assert httpx.get(base + "/dashboard/app.js", cookies=cookies).status_code == 200
    assert httpx.get(base + "/dashboard/app.js",
                     headers=eager_server.headers()).status_code == 200
    assert httpx.get(base + "/dashboard", params={"key": "wrong"}).status_code == 401


def test_live_eager_every_stall_is_the_documents_prefill(eager_server):
    reader = EventReader(eager_server.base_url, eager_server.headers())
    try:
        assert reader.wait_for(lambda r: r.messages, 60), "no snapshot"
        snap = reader.messages[0]
        assert snap["kind"] == "snapshot" and snap["target_itl_ms"] == TARGET_MS
        assert snap["settings"]["policy"] == "eager"
        doc_burst(eager_server.base_url, eager_server.headers())
        assert reader.wait_for(lambda r: len(r.events("stall")) >= 3, 60), (
            reader.events("stall"), [(s["num_prefill_tokens"], s["t_end"] - s["t_start"])
                                     for s in reader.events("step")])
        assert reader.wait_for(lambda r: any(row["prompt_tokens"] == DOC_TOKENS
                                             for row in _table(r)), 60)
    finally:
        reader.stop()
    stalls = reader.events("stall")
    assert len({s["req_id"] for s in stalls}) == 3  # each stream stalled once
    for s in stalls:
        assert s["cause"] == CAUSE_PREFILL, s
        assert s["gap_ms"] > TARGET_MS
        (cause,) = s["causes"]
        assert cause["prompt_tokens"] == DOC_TOKENS
    steps = reader.events("step")
    assert max(s["num_prefill_tokens"] for s in steps) == DOC_TOKENS  # eager: one whole step
    assert all("sampled_req_ids" in s for s in steps)
    table = _table(reader)
    doc_row = max(table, key=lambda r: r["caused_ms"])
    assert doc_row["prompt_tokens"] == DOC_TOKENS and doc_row["caused_ms"] > 3 * 500

    metrics = eager_server.metrics()
    assert metrics["cadence:stalls_total{cause=prefill}"] >= 3
    assert metrics["cadence:stall_seconds_total{cause=prefill}"] > 3 * 0.5
    assert metrics["cadence:interference_caused_seconds_total{prompt_tokens_bucket=257-1024}"] > 1.5
    assert metrics["cadence:decode_step_time_seconds_count{prefill_tokens_bucket=0}"] > 10


def test_diagnose_scrapes_the_live_server(eager_server, capsys):
    """`cadence diagnose URL`: the snapshot holds the burst above; one second of events."""
    from cadence.cli import main

    assert main(["diagnose", eager_server.base_url, "--duration", "1", "--api-key", KEY,
                 "--slo", "itl=0.2"]) == 0
    text = capsys.readouterr().out
    assert "YES: prefill/decode interference is present" in text
    assert f"Caused by prompts of {DOC_TOKENS} tokens" in text
    assert "Run: cadence serve --policy" in text


def _table(reader) -> list[dict]:
    tables = [e["requests"] for m in reader.messages if m["kind"] == "batch"
              for e in m["events"] if e["kind"] == "interference"]
    return tables[-1] if tables else []


def test_trace_has_the_same_stalls(eager_server):
    # A connected viewer must not hold the server up: its event stream ends on shutdown.
    reader = EventReader(eager_server.base_url, eager_server.headers())
    assert reader.wait_for(lambda r: r.messages, 60)
    t0 = time.monotonic()
    rc = eager_server.stop()  # SIGTERM; flushes the trace
    assert rc in (0, -signal.SIGTERM) and time.monotonic() - t0 < 20, rc
    reader.stop()
    records = list(read_trace(eager_server.trace_path))
    written = [r for r in records if r["type"] == "stall"]
    assert len(written) >= 3 and all(r["cause"] == CAUSE_PREFILL for r in written)
    att = attribute_trace(records, TARGET_MS / 1000)
    assert len(att.stalls) == len(written)
    assert all(s.causes[0].prompt_tokens == DOC_TOKENS for s in att.stalls)
    inter = [r for r in records if r["type"] == "interference"]
    assert max(inter, key=lambda r: r["caused_s"])["prompt_tokens"] == DOC_TOKENS
