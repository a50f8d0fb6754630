"""kill -9 of each role while several requests are in flight through the router (the other fault
tests kill a worker under one request at a time). No request is lost: each ends with all its
tokens or an explicit error, nothing hangs, and the surviving pool ends with no block used or
leased.

    prefill killed  two streams already handed off keep decoding to their last token (their KV
                    was pulled); a long prompt in the middle of its prefill on the killed worker
                    is served colocated on the decode worker, with the colocated tokens
    decode killed   three streams and a non-streamed request on it end with an error naming
                    the decode worker; the next request gets a 503; the prefill worker's
                    leases are all released or expired (short --kv-lease-timeout)
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.disagg.procs import spawn, wait_all, worker_args
from tests.disagg.test_router_e2e import (LONGS, PROMPTS, SLOW, _assert_pool_clean, _client,
                                          _complete, _kill_mid_prefill)

pytestmark = pytest.mark.timeout(600)

LEASE_S = 3.0


@pytest.fixture(scope="module")
def cluster(tiny_llama_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("faults"))
    slow = spawn(tmp, *worker_args(tiny_llama_dir, "prefill"), env=SLOW)
    fast = spawn(tmp, *worker_args(tiny_llama_dir, "prefill", "--kv-transfer-address",
                                   "tcp://127.0.0.1:0", "--kv-lease-timeout", str(LEASE_S)))
    dec = spawn(tmp, *worker_args(tiny_llama_dir, "decode"))
    workers = [slow, fast, dec]
    routers = {}
    try:
        wait_all(workers)
        for name, prefill, policy in (("slow", slow, "always"), ("fast", fast, "always"),
                                      ("never", fast, "never")):
            routers[name] = spawn(tmp, "router", "--prefill", prefill.url, "--decode", dec.url,
                                  "--routing-policy", policy)
        wait_all(list(routers.values()))
        yield {"prefill_slow": slow, "prefill_fast": fast, "decode": dec, **routers}
    finally:
        for p in [*routers.values(), *workers]:
            p.stop(signal.SIGKILL)


def _stream(router, prompt, max_tokens, progress=None):
    """('ok', completion tokens) or ('error', message): how a streamed request ended."""
    usage = None
    try:
        for chunk in _client(router).completions.create(
                model=None, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            if chunk.choices and progress is not None:
                progress.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
    except openai.APIError as exc:
        return "error", str(exc)
    return "ok", usage


def _whole(router, prompt, max_tokens):
    try:
        r = _client(router).completions.create(model=None, prompt=prompt, max_tokens=max_tokens,
                                               temperature=0, extra_body={"ignore_eos": True})
    except openai.APIError as exc:
        return "error", str(exc)
    return "ok", r.usage.completion_tokens


def _wait(cond, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_prefill_killed_with_requests_in_flight(cluster):
    reference = _complete(cluster["never"], LONGS[0])
    router = cluster["slow"]
    progress = [[], []]
    with ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(_stream, router, PROMPTS[1 + i], 200, progress[i])
                   for i in range(2)]
        # Both streams handed off and decoding (tokens after the first come from the decode
        # worker, after its pull).
        _wait(lambda: all(len(p) >= 3 for p in progress), "the streams never decoded")
        long = pool.submit(_complete, router, LONGS[0])
        _kill_mid_prefill(cluster["prefill_slow"])
        results = [s.result(timeout=120) for s in streams]
        assert long.result(timeout=120) == reference
    assert results == [("ok", 200), ("ok", 200)]
    m = router.metrics()
    assert m["cadence_router:requests_total{route=disaggregated}"] == 2
    assert m["cadence_router:requests_total{route=colocated}"] == 1
    assert m["cadence_router:fallbacks_total{reason=no prefill worker answered}"] == 1
    _assert_pool_clean(cluster["decode"])


def test_decode_killed_with_requests_in_flight(cluster):
    router = cluster["fast"]
    decode = cluster["decode"]
    progress = [[], [], []]
    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(_stream, router, PROMPTS[i], 400, progress[i]) for i in range(3)]
        whole = pool.submit(_whole, router, PROMPTS[2], 400)
        _wait(lambda: all(len(p) >= 3 for p in progress)
              and decode.metrics().get("cadence:num_requests_running", 0) >= 4,
              "the four requests never decoded together")
        decode.kill9()
        results = [f.result(timeout=120) for f in (*streams, whole)]
    # Nothing lost: every request ended, none with all its tokens (the decode worker was
    # killed long before 400), each with an error that names the decode worker.
    assert len(results) == 4
    for kind, detail in results:
        assert kind == "error", results
        assert "decode worker" in detail and decode.url in detail, detail
    # With its only decode worker gone, the router answers the next request with a 503.
    with pytest.raises(openai.APIStatusError) as exc:
        _client(router).completions.create(model=None, prompt=PROMPTS[2], max_tokens=4)
    assert exc.value.status_code == 503 and "no decode worker" in str(exc.value)
    # The prefill worker's pool: leases pulled before the kill were released by the decode
    # side; any handoff left unpulled expired after --kv-lease-timeout.
    time.sleep(LEASE_S)
    _assert_pool_clean(cluster["prefill_fast"])
