"""Data-parallel replicas behind `cadence router --worker ...`: two `--role both` engines and a
router per replica policy (cache-aware, least-loaded, round-robin). Greedy outputs through
every router equal a single engine's; cache-aware keeps a multi-turn conversation on the
replica its KV events say holds the prefix (cached tokens reported by the engine), round-robin
alternates; then a replica is killed with streams in flight on both: every stream ends (the
dead one's with an explicit error naming it), new requests go to the survivor, and the replica
rejoins when it is back on its port."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.disagg.procs import spawn, wait_all, worker_args

pytestmark = pytest.mark.timeout(600)

PROMPTS = ["Hi",
           "Continuous batching mixes prefill chunks with decode steps under a token budget. ",
           "Paged attention stores keys and values in fixed-size blocks. The quick brown fox"]
SYSTEM = "You are a terse assistant. Answer in one line. " * 4
POLICIES = ("cache-aware", "least-loaded", "round-robin")


@pytest.fixture(scope="module")
def replicas(tiny_llama_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("replicas"))
    workers = [spawn(tmp, *worker_args(tiny_llama_dir, "both")) for _ in range(2)]
    routers = {}
    try:
        wait_all(workers)
        for policy in POLICIES:
            routers[policy] = spawn(tmp, "router", "--worker", *[w.url for w in workers],
                                    "--routing-policy", policy)
        wait_all(list(routers.values()))
        yield {"workers": workers, "tmp": tmp, "model": tiny_llama_dir, **routers}
    finally:
        for p in [*routers.values(), *workers]:
            p.stop(signal.SIGKILL)


def _complete(url: str, prompt, max_tokens: int = 10, stream: bool = False) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]
    text = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event, event
                text.append(event["choices"][0]["text"])
    return "".join(text)


def _chat(url: str, messages: list[dict]) -> dict:
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


def _decisions(url: str, since: int) -> list[dict]:
    return httpx.get(url + "/decisions", params={"since": since}, timeout=10).json()["decisions"]


def _next_seq(url: str) -> int:
    return httpx.get(url + "/decisions", params={"since": 1 << 40}, timeout=10).json()["next"]


def test_greedy_outputs_through_every_policy_equal_a_single_engine(replicas):
    engine = replicas["workers"][0].url
    reference = [_complete(engine, p) for p in PROMPTS]
    chat = [{"role": "user", "content": "Hello world! How are you today?"}]
    chat_ref = _chat(engine, chat)["choices"][0]["message"]["content"]
    for policy in POLICIES:
        url = replicas[policy].url
        assert [_complete(url, p) for p in PROMPTS] == reference, policy
        assert [_complete(url, p, stream=True) for p in PROMPTS] == reference, policy
        assert _chat(url, chat)["choices"][0]["message"]["content"] == chat_ref, policy
        ids = [1, 15, 27, 300, 42, 42, 7, 8, 9]
        assert _complete(url, ids) == _complete(engine, ids), policy


def test_router_answers_the_model_routes_as_its_replicas(replicas):
    """/v1/models and OpenAI's GET /v1/models/{id} through the router: the replica's own
    answers, its 404 (OpenAI error format) for a name it does not serve."""
    engine = replicas["workers"][0].url
    listed = httpx.get(engine + "/v1/models", timeout=30).json()
    name = listed["data"][0]["id"]
    url = replicas["round-robin"].url
    assert httpx.get(url + "/v1/models", timeout=30).json() == listed
    card = httpx.get(url + f"/v1/models/{name}", timeout=30)
    assert card.status_code == 200 and card.json() == listed["data"][0]
    missing = httpx.get(url + "/v1/models/org/not-served", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def _conversation(url: str, topic: str, turns: int) -> list[tuple[dict, int]]:
    """(decision, cached prompt tokens) per turn of a chat that grows by its answers."""
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {turn}."})
        since = _next_seq(url)
        answer = _chat(url, messages)
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]
                         ["content"]})
        cached = ((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                  or 0)
        out.append((_decisions(url, since)[0], cached))
    return out


def test_cache_aware_keeps_a_conversation_where_its_prefix_is(replicas):
    url = replicas["cache-aware"].url
    for topic in ("paged attention", "speculative decoding"):
        turns = _conversation(url, topic, 4)
        workers = {d["worker"] for d, _ in turns}
        assert len(workers) == 1, turns
        for decision, cached in turns[1:]:
            # The router expected the prefix from the worker's own events, and the engine
            # reports at least that much served from its prefix cache.
            assert decision["cached_from"] == "events", decision
            assert decision["expected_cached_tokens"] > 0
            assert cached >= decision["expected_cached_tokens"] - 4, (decision, cached)
            # Every replica as the scorer saw it, the chosen one first with the longest prefix.
            chosen, *others = decision["candidates"]
            assert chosen["worker"] == decision["worker"]
            assert chosen["cached_tokens"] == decision["expected_cached_tokens"]
            assert all(o["cached_tokens"] <= chosen["cached_tokens"] for o in others)
            assert set(chosen["cost"]) == {"interference", "load", "kv_wait"}
    rr = replicas["round-robin"].url
    turns = _conversation(rr, "chunked prefill", 4)
    assert len({d["worker"] for d, _ in turns}) == 2


def _stream_until_end(url: str, max_tokens: int, out: dict) -> None:
    body = {"prompt": "Count: " + out["name"], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    out["tokens"], out["error"], out["usage"] = 0, None, None
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out["error"] = event["error"]
                elif event.get("usage"):
                    out["usage"] = event["usage"]
                else:
                    out["tokens"] += 1  # events (one or more tokens each)
    except httpx.HTTPError as exc:  # the router itself must never cut a stream
        out["error"] = {"transport": repr(exc)}
    out["done"] = True


def test_a_replica_killed_mid_run_ends_its_streams_and_the_rest_is_served(replicas):
    url = replicas["round-robin"].url
    a, b = replicas["workers"]
    since = _next_seq(url)
    runs = [{"name": str(i)} for i in range(4)]
    threads = [threading.Thread(target=_stream_until_end, args=(url, 400, r)) for r in runs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while (min(r.get("tokens", 0) for r in runs) < 2 and time.monotonic() < deadline):
        time.sleep(0.05)
    b.kill9()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a request hung"
    placed = [d["worker"] for d in _decisions(url, since)]
    assert sorted(placed) == sorted([a.url, b.url] * 2), placed
    for run in runs:
        assert run["done"] and run["status"] == 200
        if run["error"] is None:
            assert run["usage"]["completion_tokens"] == 400, run  # finished whole
        else:
            assert b.url in run["error"]["message"], run  # explicit, names the dead replica
    # The two on the killed replica ended with its error (unless it had finished them).
    assert 1 <= sum(1 for r in runs if r["error"]) <= 2
    # New requests all go to the survivor.
    for p in PROMPTS:
        assert _complete(url, p)
    health = httpx.get(url + "/health", timeout=10).json()
    assert {w["url"]: w["healthy"] for w in health["workers"]}[b.url] is False
    # The replica comes back on its port: it rejoins the rotation.
    port = int(b.url.rsplit(":", 1)[1])
    back = spawn(replicas["tmp"], *worker_args(replicas["model"], "both"), port=port)
    replicas["workers"].append(back)
    wait_all([back])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(url + "/health", timeout=10).json()
        if all(w["healthy"] for w in health["workers"]):
            break
        time.sleep(0.5)
    since = _next_seq(url)
    for p in PROMPTS[:2]:
        _complete(url, p)
    assert {d["worker"] for d in _decisions(url, since)} == {a.url, b.url}


def test_truncated_prompts_route_as_the_worker_runs_them(replicas):
    """truncate_prompt_tokens through the cache-aware router: the reply equals the replica's
    own, and the router counts (and hashes) the prompt the worker keeps, not the one sent:
    -1 on token ids longer than the context, k with either side, chat, and a text too long
    for /tokenize (the router then cannot hash it, but still counts what is kept)."""
    url, engine = replicas["cache-aware"].url, replicas["workers"][0].url
    context = httpx.get(engine + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 4}
    long_ids = [3 + (7 * i) % 300 for i in range(context + 100)]
    text = "Paged attention stores keys and values in fixed-size blocks. " * 6
    huge = "zq" * (context * 40)  # more characters than /tokenize takes for this context
    cases = [
        ("/v1/completions", {"prompt": long_ids, "truncate_prompt_tokens": -1}),
        ("/v1/completions", {"prompt": text, "truncate_prompt_tokens": 12,
                             "truncation_side": "right"}),
        ("/v1/completions", {"prompt": text, "truncate_prompt_tokens": 12}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text * 12}],
                                  "truncate_prompt_tokens": -1}),
        ("/v1/completions", {"prompt": huge, "truncate_prompt_tokens": 32}),
    ]
    for path, body in cases:
        direct = httpx.post(engine + path, json={**greedy, **body}, timeout=120)
        assert direct.status_code == 200, direct.text
        for attempt in range(2):  # the second time the worker's events hold the kept prompt
            since = _next_seq(url)
            routed = httpx.post(url + path, json={**greedy, **body}, timeout=120)
            assert routed.status_code == 200, routed.text
            assert routed.json()["choices"] == direct.json()["choices"], (path, body)
            (decision,) = _decisions(url, since)
            assert decision["prompt_tokens"] == routed.json()["usage"]["prompt_tokens"], body
            if attempt == 1 and body.get("prompt") is not huge:  # hashed as the worker's
                assert decision["cached_from"] == "events", decision
                assert decision["expected_cached_tokens"] > 0, decision
