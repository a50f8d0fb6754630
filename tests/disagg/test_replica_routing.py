"""Replica routing without servers: the prefix cache's events (BlockPool -> KVEventPublisher ->
CachedPrefixes over a real ZeroMQ socket), sequence gaps and snapshots, and the order each
replica policy gives (cache-aware: longest cached prefix against load; session affinity while
no events are trusted; failed workers last)."""

from __future__ import annotations

import json
import time

import zmq

from cadence.core.block_hash import extend_block_hashes
from cadence.core.block_pool import BlockPool
from cadence.disagg.kv_events import TOPIC, CachedPrefixes, KVEventPublisher
from cadence.disagg.router.replicas import PromptBlocks, ReplicaSelector
from cadence.disagg.router.request_truncation import kept_prompt_tokens
from cadence.disagg.router.workers import Worker


def _hashes(tokens: list[int], block_size: int = 4) -> list[bytes]:
    out: list[bytes] = []
    extend_block_hashes(out, tokens, block_size)
    return out


def _recv(sub: zmq.Socket, timeout_ms: int = 30000) -> dict:
    assert sub.poll(timeout_ms), "no KV event arrived"
    topic, body = sub.recv_multipart()
    assert topic == TOPIC
    return json.loads(body)


def test_block_pool_events_reach_a_subscriber_and_rebuild_its_set():
    pool = BlockPool(8)
    ctx = zmq.Context.instance()
    pub = KVEventPublisher("tcp://127.0.0.1:0", "eng", 4, pool, ctx, snapshot_interval_s=3600)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(f"tcp://127.0.0.1:{pub.port}")
    mirror = CachedPrefixes()
    try:
        hashes = _hashes(list(range(12)))  # 3 full blocks
        blocks = pool.allocate(3)
        for b, h in zip(blocks, hashes):
            assert pool.cache_block(b, h)
        # PUB/SUB drops what is sent before the subscription is up: snapshots repair that.
        deadline = time.monotonic() + 30
        while not mirror.trusted and time.monotonic() < deadline:
            pub._next_snapshot = 0.0
            pub.publish()
            if sub.poll(100):
                mirror.apply(json.loads(sub.recv_multipart()[1]))
        pub._new_subscriber()  # a late subscription notice would turn the delta into a snapshot
        assert mirror.trusted and mirror.block_size == 4
        assert mirror.longest_prefix_blocks(hashes) == 3
        # Free and evict the first block (reallocated): a delta removes it; the chain then
        # matches nothing (block 0 is gone).
        pool.free(blocks)
        pool.reset_prefix_cache()
        pub.publish()
        # Under load the loop above can send more snapshots (of the same set) before the first
        # is read: they arrive before the delta, in order (one connection); take them first.
        msg = _recv(sub)
        while msg["kind"] == "snapshot":
            mirror.apply(msg)
            msg = _recv(sub)
        assert msg["kind"] == "delta" and len(msg["removed"]) == 3
        mirror.apply(msg)
        assert mirror.trusted and mirror.longest_prefix_blocks(hashes) == 0
        # A sequence gap (a message lost): no longer trusted until the next snapshot.
        pub.seq += 1
        b = pool.allocate(1)
        pool.cache_block(b[0], hashes[0])
        pub.publish()
        mirror.apply(_recv(sub))
        assert not mirror.trusted
        pub._next_snapshot = 0.0
        pub.publish()
        snap = _recv(sub)
        mirror.apply(snap)
        assert snap["kind"] == "snapshot" and mirror.trusted
        assert mirror.longest_prefix_blocks(hashes) == 1
    finally:
        sub.close()
        pub.close()
    assert pool.cache_events is None


def test_a_restarted_worker_is_not_trusted_before_its_snapshot():
    mirror = CachedPrefixes()
    mirror.apply({"engine_id": "a", "seq": 1, "block_size": 4, "kind": "snapshot",
                  "stored": ["00" * 16], "removed": []})
    assert mirror.trusted
    mirror.apply({"engine_id": "b", "seq": 1, "block_size": 4, "kind": "delta",
                  "stored": [], "removed": []})
    assert not mirror.trusted


def _trusted(hashes: list[bytes]) -> CachedPrefixes:
    c = CachedPrefixes()
    c.apply({"engine_id": "x", "seq": 1, "block_size": 4, "kind": "snapshot",
             "stored": [h.hex() for h in hashes], "removed": []})
    return c


def test_cache_aware_prefers_the_longest_cached_prefix_until_load_outweighs_it():
    a, b = Worker("http://a", "decode"), Worker("http://b", "decode")
    prompt = PromptBlocks(list(range(40)))
    sel = ReplicaSelector("cache-aware", load_weight=1.0)
    sel.events["http://b"] = _trusted(_hashes(prompt.token_ids)[:8])  # b holds 32 of 40
    assert sel.cached_tokens(b, prompt) == (32, "events")
    assert [w.url for w in sel.order([a, b], prompt, 40)] == ["http://b", "http://a"]
    # b busy: its queued work (and the stall its streams would take) outweighs 32 cached
    # tokens; a long cached prefix in flight there is no work.
    b.outstanding_tokens, b.outstanding_work, b.outstanding_requests = 2000, 0, 2
    assert sel.order([a, b], prompt, 40)[0] is b
    b.outstanding_work = 200
    assert sel.order([a, b], prompt, 40)[0] is a
    b.outstanding_tokens = b.outstanding_work
    # Weight 0: the cache alone decides (no events: a, the first of two equal costs).
    assert ReplicaSelector("cache-aware", 0.0).order([a, b], prompt, 40)[0] is a
    sel0 = ReplicaSelector("cache-aware", 0.0)
    sel0.events["http://b"] = sel.events["http://b"]
    b.outstanding_requests = 0
    assert sel0.order([a, b], prompt, 40)[0] is b
    # A KV pool that cannot hold what is in flight there and this request: it would wait.
    b.outstanding_requests, b.outstanding_tokens, b.outstanding_work = 1, 200, 100
    b.metrics["cadence:kv_cache_blocks_total"] = 60  # 240 tokens of 4-token blocks
    assert sel0.cost(b, prompt, 16) == 8 * 2 + 100 + 8
    # The terms the router's decision records show (GET /decisions: which one moved a
    # request off the replica with the longest prefix).
    assert sel0.cost_terms(b, prompt, 16) == {"interference": 16.0, "load": 0.0,
                                              "kv_wait": 108.0}
    assert sel.cost_terms(b, prompt, 16)["load"] == 100.0
    assert sel0.order([a, b], prompt, 16)[0] is a
    b.metrics["cadence:kv_cache_blocks_total"] = 64
    assert sel0.cost(b, prompt, 16) == 8 * 2 and sel0.order([a, b], prompt, 16)[0] is b
    b.metrics.clear()
    b.outstanding_requests = b.outstanding_tokens = b.outstanding_work = 0
    # A failed worker comes last whatever it holds.
    b.mark_failed(60.0)
    assert sel0.order([a, b], prompt, 40)[0] is a


def test_session_affinity_without_events_and_the_other_policies():
    a, b = Worker("http://a", "decode"), Worker("http://b", "decode")
    turn1 = PromptBlocks(list(range(40)))
    turn2 = PromptBlocks(list(range(40)) + list(range(100, 116)))
    sel = ReplicaSelector("cache-aware")
    b.outstanding_work = 5  # a is the less loaded one for a cold prompt
    first = sel.order([a, b], turn1, 40)[0]
    assert first is a
    sel.sent_to(first, turn1)
    a.outstanding_work = 10  # busier now, but holds the conversation's prefix
    assert sel.cached_tokens(a, turn2) == (32, "affinity")  # two whole 16-token blocks
    assert sel.order([a, b], turn2, 56)[0] is a
    rr = ReplicaSelector("round-robin")
    assert [rr.order([a, b], None, 1)[0].url for _ in range(4)] == ["http://a", "http://b"] * 2
    a.outstanding_tokens = 10  # least-loaded counts every token in flight
    assert ReplicaSelector("least-loaded").order([a, b], None, 1)[0] is b


def test_a_new_subscriber_gets_a_snapshot_at_the_next_turn():
    """A router that connects after the worker's last snapshot is trusted at the worker's next
    turn (XPUB sees the subscription), not a whole snapshot interval later."""
    pool = BlockPool(8)
    ctx = zmq.Context.instance()
    pub = KVEventPublisher("tcp://127.0.0.1:0", "eng", 4, pool, ctx, snapshot_interval_s=3600)
    hashes = _hashes(list(range(8)))
    for b, h in zip(pool.allocate(2), hashes):
        assert pool.cache_block(b, h)
    pub.publish()  # the periodic snapshot goes out to nobody; the next one is an hour away
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(f"tcp://127.0.0.1:{pub.port}")
    mirror = CachedPrefixes()
    try:
        deadline = time.monotonic() + 30
        while not mirror.trusted and time.monotonic() < deadline:
            pub.publish()  # engine turns; nothing forces a snapshot but the subscription
            if sub.poll(50):
                mirror.apply(json.loads(sub.recv_multipart()[1]))
        assert mirror.trusted and mirror.longest_prefix_blocks(hashes) == 2
        assert pub._next_snapshot > time.monotonic() + 3000  # the hourly schedule resumed
    finally:
        sub.close()
        pub.close()


def test_prompt_blocks_hash_a_salted_prompt_as_the_workers_do():
    """cache_salt: the router's hashes of a salted prompt are the engine's (so KV events and
    affinity still match), and differ from the unsalted prompt's from the first block on."""
    from cadence.core.kv_cache_manager import KVCacheManager
    from cadence.core.request import Request
    from cadence.core.sampling_params import SamplingParams

    ids = list(range(40))
    engine_side = Request("r", ids, SamplingParams(), 0.0, cache_salt="tenant")
    kv = KVCacheManager(num_blocks=16, block_size=16)
    kv.get_computed_blocks(engine_side)  # computes the request's chained hashes
    assert PromptBlocks(ids, "tenant").hashes(16) == engine_side.block_hashes
    unsalted = PromptBlocks(ids).hashes(16)
    assert len(unsalted) == 2 and not set(unsalted) & set(engine_side.block_hashes)
    # From a request body: its salt, and the tokens truncate_prompt_tokens leaves.
    body = {"cache_salt": "tenant", "truncate_prompt_tokens": 40}
    routed = PromptBlocks.of_request(ids + [7] * 8, body,
                                     kept_prompt_tokens("completions", body, None))
    assert routed.token_ids == ids[8:] + [7] * 8 and routed.cache_salt == "tenant"
    right = {"truncate_prompt_tokens": 3, "truncation_side": "right"}
    assert PromptBlocks.of_request(ids, right, kept_prompt_tokens("completions", right, 64)
                                   ).token_ids == [0, 1, 2]


def test_the_router_keeps_the_prompt_tokens_a_worker_keeps():
    """kept_prompt_tokens resolves truncate_prompt_tokens as the worker does: -1 leaves the
    context less the output (completions' max_tokens defaults to 16, chat's leaves room for
    one token), unknown without the context length; values the worker refuses are None."""
    completions = {"truncate_prompt_tokens": -1}
    assert kept_prompt_tokens("completions", completions, None) is None
    assert kept_prompt_tokens("completions", completions, 512) == 512 - 16
    assert kept_prompt_tokens("completions", {**completions, "max_tokens": 4}, 512) == 508
    assert kept_prompt_tokens("chat", completions, 512) == 511
    assert kept_prompt_tokens("chat", {**completions, "max_tokens": 9,
                                       "max_completion_tokens": 4}, 512) == 508
    assert kept_prompt_tokens("completions", {"truncate_prompt_tokens": 7}, None) == 7
    assert kept_prompt_tokens("completions", {"truncate_prompt_tokens": 600}, 512) is None
    assert kept_prompt_tokens("completions", {"truncate_prompt_tokens": 0}, 512) is None
    assert kept_prompt_tokens("completions", {}, 512) is None
    ids = list(range(600))
    assert len(PromptBlocks.of_request(ids, completions, 496)) == 496
    assert PromptBlocks.of_request(ids, completions, 496).token_ids == ids[-496:]


def test_the_router_tokenizes_a_chat_with_every_field_that_changes_its_ids():
    """The cache-aware router asks a worker's /tokenize for a chat's ids with the fields the
    worker's chat completion renders with (documents and reasoning_effort included), so it
    hashes the prompt the replica runs; sampling fields stay out of the ask."""
    import asyncio

    import httpx

    from cadence.disagg.router.app import Router
    from cadence.disagg.router.config import RouterConfig
    from cadence.disagg.router.forward import Forwarder

    asked: list[dict] = []

    def worker(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        return httpx.Response(200, json={"count": 3, "max_model_len": 64, "tokens": [5, 6, 7]})

    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
            "documents": [{"title": "a", "text": "alpha"}], "reasoning_effort": "low",
            "chat_template_kwargs": {"x": 1}, "add_generation_prompt": True,
            "chat_template": "{{ messages }}", "continue_final_message": False,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "add_special_tokens": False}

    async def ask() -> list[int] | None:
        router = Router(RouterConfig(worker_urls=("http://w0",)))
        router.client = httpx.AsyncClient(transport=httpx.MockTransport(worker))
        router.forward = Forwarder(router.client, 1.0, {})
        try:
            return await router._prompt_token_ids("chat", body)
        finally:
            await router.client.aclose()

    assert asyncio.run(ask()) == [5, 6, 7]
    assert asked == [{k: v for k, v in body.items() if k != "temperature"}]
