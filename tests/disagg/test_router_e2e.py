"""Disaggregated serving end to end, with the official `openai` client through `cadence
router`: 2 prefill workers (KV over IPC and over TCP) and a decode worker, routers with
policies always / never / auto over them. Greedy outputs are identical whichever way a request
goes (1P1D IPC, 1P1D TCP, 2P1D); then the faults: kill -9 of a prefill worker in the middle of a
request's prefill (two slowed prefill workers: the router retries on the other one, then, when
that one is killed mid-prefill too, serves the request colocated), kill -9 of a prefill worker
between requests (colocated fallback), kill -9 of the decode worker mid-stream (the stream ends
with an explicit error naming it). After each fault the surviving pools hold no block."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from cadence.disagg.worker import TEST_PREFILL_STEP_DELAY_ENV
from tests.disagg.procs import Proc, spawn, wait_all, worker_args

pytestmark = pytest.mark.timeout(600)

PROMPTS = [
    "Hi",  # shorter than one block
    "Continuous batching mixes prefill chunks with decode steps under a token budget. " * 2,
    "Paged attention stores keys and values in fixed-size blocks. The quick brown fox",
]
CHAT = [{"role": "user", "content": "Hello world! How are you today? " * 3}]
# ~280 tokens: 5 prefill chunks at the workers' budget of 64, each 0.4 s on the slowed workers
# (two different prompts: a prefix-cache hit would skip the prefill).
LONGS = ["Paged attention stores keys and values in fixed-size blocks. " * 10,
         "Chunked prefill splits a long prompt into budget-sized pieces. " * 10]
SLOW = {TEST_PREFILL_STEP_DELAY_ENV: "0.4"}


@pytest.fixture(scope="module")
def cluster(tiny_llama_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("disagg"))
    p_ipc = spawn(tmp, *worker_args(tiny_llama_dir, "prefill"))
    p_tcp = spawn(tmp, *worker_args(tiny_llama_dir, "prefill",
                                    "--kv-transfer-address", "tcp://127.0.0.1:0"))
    dec = spawn(tmp, *worker_args(tiny_llama_dir, "decode"))
    slow_a = spawn(tmp, *worker_args(tiny_llama_dir, "prefill"), env=SLOW)
    slow_b = spawn(tmp, *worker_args(tiny_llama_dir, "prefill"), env=SLOW)
    workers = [p_ipc, p_tcp, dec, slow_a, slow_b]
    routers = {}
    try:
        wait_all(workers)
        for name, prefills, policy in (("ipc", [p_ipc], "always"), ("tcp", [p_tcp], "always"),
                                       ("2p1d", [p_ipc, p_tcp], "always"),
                                       ("never", [p_ipc], "never"),
                                       ("auto", [p_ipc], "auto"),
                                       ("faults", [slow_a, slow_b], "always")):
            routers[name] = spawn(tmp, "router", "--prefill", *[p.url for p in prefills],
                                  "--decode", dec.url, "--routing-policy", policy)
        wait_all(list(routers.values()))
        yield {"prefill_ipc": p_ipc, "prefill_tcp": p_tcp, "decode": dec, "slow_a": slow_a,
               "slow_b": slow_b, **routers}
    finally:
        for p in [*routers.values(), *workers]:
            p.stop(signal.SIGKILL)


def _client(proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _complete(proc, prompt, stream=False, max_tokens=12):
    client = _client(proc)
    if not stream:
        r = client.completions.create(model=None, prompt=prompt, max_tokens=max_tokens,
                                      temperature=0, extra_body={"ignore_eos": True})
        return r.choices[0].text, r.usage.completion_tokens
    chunks = client.completions.create(model=None, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    text, usage = [], None
    for c in chunks:
        if c.choices:
            text.append(c.choices[0].text)
        if c.usage is not None:
            usage = c.usage.completion_tokens
    return "".join(text), usage


def _chat(proc, stream=False):
    client = _client(proc)
    model = client.models.list().data[0].id
    if not stream:
        r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10,
                                           temperature=0, extra_body={"ignore_eos": True})
        return r.choices[0].message.content
    parts = []
    for c in client.chat.completions.create(model=model, messages=CHAT, max_tokens=10,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}):
        if c.choices and c.choices[0].delta.content:
            parts.append(c.choices[0].delta.content)
    return "".join(parts)


def test_outputs_identical_colocated_and_disaggregated(cluster):
    reference = [_complete(cluster["never"], p) for p in PROMPTS]
    assert all(n == 12 for _, n in reference)
    chat_ref = _chat(cluster["never"])
    for name in ("ipc", "tcp", "2p1d"):
        router = cluster[name]
        assert [_complete(router, p) for p in PROMPTS] == reference, name
        assert [_complete(router, p, stream=True) for p in PROMPTS] == reference, name
        assert _chat(router) == chat_ref and _chat(router, stream=True) == chat_ref, name
    # Prefix-cache hit on the decode side: the same long prompt again pulls fewer blocks.
    before = cluster["decode"].metrics()
    assert _complete(cluster["ipc"], PROMPTS[1]) == reference[1]
    after = cluster["decode"].metrics()
    moved = after["cadence:kv_transfer_bytes_total"] - before["cadence:kv_transfer_bytes_total"]
    per_token = after["cadence:kv_bytes_per_token"]
    assert after["cadence:kv_transfers_total"] == before["cadence:kv_transfers_total"] + 1
    assert moved < per_token * 4  # at most the last partial block
    m = cluster["ipc"].metrics()
    assert m["cadence_router:requests_total{route=disaggregated}"] >= 7
    assert cluster["never"].metrics()["cadence_router:requests_total{route=colocated}"] >= 4
    served = sum(cluster[p].metrics()["cadence:kv_bytes_served_total"]
                 for p in ("prefill_ipc", "prefill_tcp"))
    assert served == after["cadence:kv_transfer_bytes_total"] > 0
    # Every prefill lease was released by the decode side: no blocks held anywhere.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        used = [cluster[p].metrics()["cadence:kv_cache_blocks_used"]
                for p in ("prefill_ipc", "prefill_tcp", "decode")]
        if used == [0, 0, 0]:
            break
        time.sleep(0.2)
    assert used == [0, 0, 0]


def test_auto_policy_serves_a_lone_request_colocated(cluster):
    router = cluster["auto"]
    seq = httpx.get(router.url + "/decisions").json()["next"]
    for prompt in PROMPTS[:2]:  # one at a time: never a stream to protect
        _complete(router, prompt)
    m = router.metrics()
    assert m["cadence_router:decisions_total{reason=no stream to protect}"] >= 2
    assert m.get("cadence_router:requests_total{route=disaggregated}", 0) == 0
    # The requests' own records: estimated prompt lengths, the reason, where each went.
    record = httpx.get(router.url + "/decisions", params={"since": seq}).json()
    assert record["next"] == seq + 2 and len(record["decisions"]) == 2
    for d in record["decisions"]:
        assert d["reason"] == "no stream to protect" and not d["disaggregate"]
        assert d["prompt_tokens"] > 0 and not d["prompt_tokens_exact"]
    health = httpx.get(router.url + "/health").json()
    assert health["routing_policy"] == "auto" and "prefill_tok_s" in health["cost_model"]


def test_worker_errors_reach_the_client(cluster):
    client = _client(cluster["ipc"])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=None, prompt="", max_tokens=4)
    models = client.models.list()
    assert models.data


def _assert_pool_clean(worker: Proc) -> None:
    """The worker's KV pool from outside: no block used or leased, every block free (leases are
    released asynchronously after the decode side's pull: a bounded wait)."""
    deadline = time.monotonic() + 60
    while True:
        m = worker.metrics()
        clean = (m["cadence:kv_cache_blocks_used"] == 0
                 and m["cadence:kv_cache_blocks_leased"] == 0
                 and m["cadence:kv_cache_blocks_free"] == m["cadence:kv_cache_blocks_total"])
        if clean or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kv = {k: v for k, v in m.items()
          if k.startswith(("cadence:kv_", "cadence:num_requests", "cadence:kv_leases"))}
    assert clean, f"{worker.url}: " + ", ".join(f"{k}={v:g}" for k, v in kv.items())


def _kill_mid_prefill(worker: Proc) -> None:
    """kill -9 the worker once it reports the request running (its first prefill chunk done;
    four more chunks of 0.4 s each still to go)."""
    deadline = time.monotonic() + 60
    while worker.metrics().get("cadence:num_requests_running", 0) < 1:
        assert time.monotonic() < deadline, "the prefill worker never started the request"
        time.sleep(0.02)
    worker.kill9()


def test_prefill_killed_mid_prefill_retries_then_falls_back(cluster):
    reference = [_complete(cluster["never"], p) for p in LONGS]
    router = cluster["faults"]
    with ThreadPoolExecutor(1) as pool:
        # 1. slow_a dies in the middle of the prefill: the router retries on slow_b, which
        # completes the handoff; the decode worker serves it disaggregated, same tokens.
        request = pool.submit(_complete, router, LONGS[0])
        _kill_mid_prefill(cluster["slow_a"])
        assert request.result(timeout=120) == reference[0]
        m = router.metrics()
        assert m.get("cadence_router:requests_total{route=disaggregated}") == 1
        assert m.get("cadence_router:fallbacks_total{reason=no prefill worker answered}",
                     0) == 0
        _assert_pool_clean(cluster["slow_b"])
        # 2. slow_b dies in the middle of the next prefill; slow_a is gone: the request is
        # served colocated on the decode worker, same tokens.
        request = pool.submit(_complete, router, LONGS[1], True)
        _kill_mid_prefill(cluster["slow_b"])
        assert request.result(timeout=120) == reference[1]
    m = router.metrics()
    assert m["cadence_router:fallbacks_total{reason=no prefill worker answered}"] == 1
    assert m["cadence_router:requests_total{route=colocated}"] == 1
    _assert_pool_clean(cluster["decode"])


def test_prefill_death_falls_back_then_decode_death_is_explicit(cluster):
    # kill -9 the prefill worker: the router's next disaggregated request finds it gone and is
    # served colocated on the decode worker (same tokens).
    reference = _complete(cluster["never"], PROMPTS[2])
    cluster["prefill_ipc"].proc.send_signal(signal.SIGKILL)
    cluster["prefill_ipc"].proc.wait()
    assert _complete(cluster["ipc"], PROMPTS[2]) == reference
    m = cluster["ipc"].metrics()
    assert m["cadence_router:fallbacks_total{reason=no prefill worker answered}"] >= 1
    # The surviving pools hold no blocks (the other prefill worker's leases all released).
    for name in ("decode", "prefill_tcp"):
        _assert_pool_clean(cluster[name])
    # kill -9 the decode worker mid-stream: the stream ends with an explicit error event.
    client = _client(cluster["tcp"])
    stream = client.completions.create(model=None, prompt=PROMPTS[1], max_tokens=400,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    got_tokens = 0
    killer = None
    with pytest.raises(openai.APIError, match="decode worker .* failed mid-stream"):
        for chunk in stream:
            got_tokens += 1
            if got_tokens == 3 and killer is None:
                killer = threading.Thread(
                    target=lambda: cluster["decode"].proc.send_signal(signal.SIGKILL))
                killer.start()
    assert got_tokens >= 3
    # The prefill worker released that request's lease after the pull: its pool is clean.
    _assert_pool_clean(cluster["prefill_tcp"])
