"""Parsing SSE chunks and Prometheus /metrics text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cadence.bench.arrivals import send_offsets
from cadence.bench.client import _error_message
from cadence.bench.metrics_scraper import parse_metrics
from cadence.bench.sse import SSEFormatError, data_payload, parse_chunk


def test_data_payload():
    assert data_payload("data: {\"a\": 1}") == '{"a": 1}'
    assert data_payload("data:[DONE]") == "[DONE]"
    assert data_payload(": keep-alive") is None
    assert data_payload("") is None
    assert data_payload("event: message") is None


def test_completion_chat_logprobs_usage_and_error_chunks():
    text = parse_chunk(json.dumps({"choices": [{"text": " hi", "finish_reason": None}]}))
    assert (text.tokens, text.text, text.counted_by_logprobs) == (1, " hi", False)
    chat = parse_chunk(json.dumps({"choices": [{"delta": {"content": "yo"}, "finish_reason": "stop"}]}))
    assert (chat.tokens, chat.finish_reason) == (1, "stop")
    several = parse_chunk(json.dumps({"choices": [{"text": "abc", "logprobs": {"tokens": ["a", "b", "c"]}}]}))
    assert (several.tokens, several.counted_by_logprobs) == (3, True)
    usage = parse_chunk(json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}))
    assert usage.tokens == 0 and usage.usage["completion_tokens"] == 7
    empty = parse_chunk(json.dumps({"choices": [{"text": "", "finish_reason": "length"}]}))
    assert empty.tokens == 0 and empty.finish_reason == "length"
    err = parse_chunk(json.dumps({"error": {"message": "engine died", "code": 500}}))
    assert err.error == "engine died"
    with pytest.raises(SSEFormatError):
        parse_chunk("not json")


def test_error_message_from_bodies():
    assert _error_message(json.dumps({"error": {"message": "too long"}})) == "too long"
    assert _error_message(json.dumps({"detail": "Not Found"})) == "Not Found"
    assert _error_message("plain failure") == "plain failure"
    assert _error_message("") == "(empty body)"


def test_parse_metrics_cadence_and_vllm_names():
    text = "\n".join([
        "# HELP cadence:kv_cache_usage_perc KV usage",
        "# TYPE cadence:kv_cache_usage_perc gauge",
        'cadence:kv_cache_usage_perc{model_name="m"} 0.25',
        "# TYPE cadence:num_requests_running gauge",
        "cadence:num_requests_running 3",
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{model_name="a"} 1',
        'vllm:num_requests_waiting{model_name="b"} 2',
        "# TYPE cadence:num_preemptions counter",
        "cadence:num_preemptions_total 4",
        "# TYPE other_metric gauge",
        "other_metric 9",
    ])
    assert parse_metrics(text + "\n") == {
        "kv_cache_usage_perc": 0.25, "num_requests_running": 3.0, "num_requests_waiting": 3.0,
        "num_preemptions_total": 4.0,
    }


def test_arrival_offsets_seeded_and_rate_preserving():
    a = send_offsets(2000, rate=4.0, burstiness=1.0, seed=3)
    assert a == send_offsets(2000, rate=4.0, burstiness=1.0, seed=3)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    gaps = np.diff(a)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.1)
    bursty = np.diff(send_offsets(2000, rate=4.0, burstiness=0.25, seed=3))
    assert np.mean(bursty) == pytest.approx(0.25, rel=0.15)
    assert np.std(bursty) > 1.5 * np.std(gaps)  # gamma shape < 1: burstier than Poisson
    with pytest.raises(ValueError):
        send_offsets(3, rate=0.0, burstiness=1.0, seed=0)
