"""API key, queue limits (429) and disconnect handling, on the fake engine (fast, no model).

The fake engine runs one request at a time (max_running=1) with a small step delay, so
requests really queue behind each other.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from server_harness import fake_engine_args, openai_client, start_server

KEY = "sk-test-cadence"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(str(tmp_path_factory.mktemp("fake")),
                       *fake_engine_args(max_model_len=512, step_delay_s=0.01, max_running=1),
                       "--max-num-queued-requests", "2", "--max-num-queued-tokens", "40",
                       api_key=KEY)
    yield srv
    srv.stop()


def _client(server, key=KEY) -> openai.OpenAI:
    return openai_client(server, api_key=key)


@pytest.mark.parametrize("path,method", [("/v1/models", "GET"), ("/metrics", "GET"),
                                         ("/v1/completions", "POST"),
                                         ("/v1/chat/completions", "POST"),
                                         ("/invocations", "POST")])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}])
def test_missing_or_bad_key_is_401(server, path, method, headers):
    resp = httpx.request(method, server.base_url + path, headers=headers,
                         json={"prompt": "hi", "max_tokens": 2}, timeout=10)
    assert resp.status_code == 401
    err = resp.json()["error"]
    assert err["code"] == "invalid_api_key" and err["message"]


@pytest.mark.parametrize("body", [b'{"prompt": "hi", ', b"\xff\xfe not json", b"x" * 10**6])
def test_key_is_checked_before_the_body(server, body):
    resp = httpx.post(server.base_url + "/v1/completions", content=body, timeout=10,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key(server):
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/ping").status_code == 200
    assert httpx.post(server.base_url + "/ping").status_code == 200


def test_good_key_is_served(server):
    with pytest.raises(openai.AuthenticationError):
        _client(server, "nope").models.list()
    resp = _client(server).completions.create(model="fake-model", prompt="hello", max_tokens=3,
                                              temperature=0)
    assert resp.usage.completion_tokens == 3


def test_429_past_queued_tokens(server):
    # Nothing queued: a 41-token prompt alone exceeds --max-num-queued-tokens 40.
    with pytest.raises(openai.RateLimitError) as info:
        _client(server).completions.create(model="fake-model", prompt="x" * 41, max_tokens=2)
    assert info.value.status_code == 429
    assert info.value.body["code"] == "queue_full"
    assert int(info.value.response.headers["retry-after"]) >= 1


def test_429_past_queued_requests_then_recovers(server):
    client = _client(server)
    running = client.completions.create(model="fake-model", prompt="run", max_tokens=80,
                                        stream=True, extra_body={"ignore_eos": True})
    next(iter(running))  # it runs; everything after it queues
    results = {}

    def queued(name: str) -> None:
        resp = client.completions.create(model="fake-model", prompt=name, max_tokens=2,
                                         extra_body={"ignore_eos": True})
        results[name] = resp.choices[0].finish_reason

    threads = [threading.Thread(target=queued, args=(n,)) for n in ("q1", "q2")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while server.metrics().get("cadence:num_requests_waiting") != 2:
        assert time.monotonic() < deadline, "the two requests never queued"
        time.sleep(0.02)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model="fake-model", prompt="q3", max_tokens=2)
    assert "2 requests already queued" in info.value.body["message"]
    running.close()  # disconnect: aborts the running request, the queue drains
    for t in threads:
        t.join(30)
    assert results == {"q1": "length", "q2": "length"}


def test_disconnect_aborts_and_frees_blocks(server):
    before = server.metrics()
    stream = _client(server).completions.create(model="fake-model", prompt="long story",
                                                max_tokens=400, stream=True,
                                                extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert server.metrics()["cadence:kv_cache_blocks_used"] > 0
    stream.close()
    deadline = time.monotonic() + 60
    while True:
        m = server.metrics()
        if m["cadence:kv_cache_blocks_used"] == 0 and m["cadence:num_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, "the disconnected request kept its blocks"
        time.sleep(0.05)
    key = "cadence:request_success_total{finished_reason=abort}"
    assert m[key] == before.get(key, 0) + 1
    assert m["cadence:kv_cache_usage_perc"] == 0.0


def test_non_streaming_client_that_gives_up_is_aborted(server):
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", headers=server.headers(), timeout=0.5,
                   json={"prompt": "patience", "max_tokens": 450, "ignore_eos": True})
    key = "cadence:request_success_total{finished_reason=abort}"
    deadline = time.monotonic() + 60
    while True:
        m = server.metrics()
        if m.get(key, 0) == before.get(key, 0) + 1 and m["cadence:kv_cache_blocks_used"] == 0:
            break
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.05)
