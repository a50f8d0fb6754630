"""The router's per-request decision and its balancing, without processes: auto hands off only
when the decode worker has streams whose stall (P / prefill rate each) outweighs the measured
handoff cost; always / never ignore the numbers; least outstanding tokens picks workers."""

from __future__ import annotations

from cadence.disagg.router.policy import CostModel, RoutingPolicy
from cadence.disagg.router.workers import Outstanding, Worker, WorkerPool


def _model() -> CostModel:
    m = CostModel(prefill_tok_s=1000.0, transfer_bytes_s=1e8, kv_bytes_per_token=20_000.0,
                  hop_s=0.01)
    return m


def test_auto_chooses_both_sides_of_the_line():
    policy = RoutingPolicy("auto", _model(), min_prompt_tokens=64)
    prefill, decode = Worker("p", "prefill"), Worker("d", "decode")
    # No stream to protect: colocated, whatever the length.
    assert not policy.decide(4000, prefill, decode).disaggregate
    decode.outstanding_requests = 3
    # Long prompt, three streams: 3 * 2 s of stall vs 0.8 s transfer + hop -> hand off.
    d = policy.decide(2000, prefill, decode)
    assert d.disaggregate and d.gain_s > d.cost_s and d.streams == 3
    # Short prompt: under the floor.
    assert policy.decide(32, prefill, decode).reason == "short prompt"
    # Mid prompt where moving the KV costs more than the stall it avoids (slow transfer).
    slow = _model()
    slow.transfer_bytes_s = 1e6
    d = RoutingPolicy("auto", slow).decide(200, prefill, decode)
    assert not d.disaggregate and d.cost_s > d.gain_s
    # A backlogged prefill worker makes the handoff lose too.
    prefill.outstanding_tokens = 100_000
    assert not policy.decide(2000, prefill, decode).disaggregate


def test_streams_are_the_routers_own_and_those_arrivals_see():
    model = _model()
    policy = RoutingPolicy("auto", model, min_prompt_tokens=64)
    prefill, decode = Worker("p", "prefill"), Worker("d", "decode")
    # A scraped gauge still shows the previous request running (it lags a scrape period):
    # requests sent one at a time are not streams to protect.
    decode.num_running = 1
    for t in range(5):
        model.observe_arrival(0, now=float(t))
    assert policy.decide(2000, prefill, decode).reason == "no stream to protect"
    # A long prompt arriving at an idle decode worker while requests keep arriving (arrivals
    # saw 2 in flight on average): its prefill would stall the ones that come during it.
    for t in range(5, 15):
        model.observe_arrival(2, now=float(t))
    assert 1.0 < model.mean_in_flight < 2.0
    d = policy.decide(2000, prefill, decode)
    assert d.disaggregate and d.reason == "interference outweighs handoff"
    # The mean forgets with its time constant: long after the traffic stopped, one quiet
    # arrival brings it back near 0 and the idle worker keeps the prompt.
    model.observe_arrival(0, now=15.0 + 10 * model.concurrency_time_constant_s)
    assert model.mean_in_flight < 0.01
    assert policy.decide(2000, prefill, decode).reason == "handoff costs more"


def test_always_never_and_missing_prefill():
    prefill, decode = Worker("p", "prefill"), Worker("d", "decode")
    assert RoutingPolicy("always", _model()).decide(3, prefill, decode).disaggregate
    assert not RoutingPolicy("never", _model()).decide(5000, prefill, decode).disaggregate
    assert not RoutingPolicy("always", _model()).decide(5000, None, decode).disaggregate
    assert not RoutingPolicy("always", _model()).decide(
        5000, prefill, decode, wants_logprobs=True).disaggregate


def test_cost_model_learns():
    m = CostModel()
    for _ in range(30):
        m.observe_prefill(2000, 1.0)
        m.observe_transfers(4e6, 0.01)
        m.observe_prompt(1000, 250)
    assert abs(m.prefill_tok_s - 2000) < 50
    assert abs(m.transfer_bytes_s - 4e8) < 1e7
    assert abs(m.tokens_per_char - 0.25) < 0.01 and m.estimate_tokens(400) == 100


def test_prefill_fit_fixed_and_per_token():
    m = CostModel()
    for _ in range(20):  # calls of 100 and 1000 tokens: 0.2 s fixed + 1 ms per token
        m.observe_prefill(100, 0.3)
        m.observe_prefill(1000, 1.2)
    assert abs(m.prefill_tok_s - 1000) < 1 and abs(m.prefill_fixed_s - 0.2) < 1e-3
    assert abs(m.prefill_queue_s(3, 1500) - (0.6 + 1.5)) < 1e-2
    m = CostModel()
    for _ in range(20):  # the same length every time: no fixed part can be told apart
        m.observe_prefill(500, 1.0)
    assert abs(m.prefill_tok_s - 500) < 1 and m.prefill_fixed_s == 0.0


def test_short_prompts_handed_off_until_the_prefill_backlog_costs_more():
    # The default has no length floor: a 30-token prompt stalls 6 streams by 6 * 30 ms, more
    # than moving its KV (30 * 20 kB at 100 MB/s) and the hop cost.
    m = _model()
    m.prefill_fixed_s = 0.1
    policy = RoutingPolicy("auto", m)
    prefill, decode = Worker("p", "prefill"), Worker("d", "decode")
    decode.outstanding_requests = 6
    d = policy.decide(30, prefill, decode)
    assert d.disaggregate and d.gain_s > d.cost_s
    # Ten short calls queued on the prefill worker: their fixed cost alone (1 s) exceeds the
    # stall a colocated prefill of this prompt causes: colocated.
    prefill.outstanding_requests, prefill.outstanding_tokens = 10, 300
    d = policy.decide(30, prefill, decode)
    assert not d.disaggregate and d.reason == "handoff costs more" and d.cost_s > 1.0
    # A floor, where a deployment wants one, still keeps short prompts colocated.
    prefill.outstanding_requests, prefill.outstanding_tokens = 0, 0
    assert RoutingPolicy("auto", m, min_prompt_tokens=64).decide(
        30, prefill, decode).reason == "short prompt"


def test_least_outstanding_tokens_and_failed_workers_last():
    pool = WorkerPool("decode", ("http://a", "http://b", "http://c"))
    a, b, c = pool.workers
    with Outstanding(a, 500), Outstanding(b, 100):
        assert pool.pick() is c
        with Outstanding(c, 1000):
            assert pool.pick() is b
            b.mark_failed(60.0)
            assert [w.url for w in pool.candidates()] == ["http://a", "http://c", "http://b"]
    assert a.outstanding_tokens == 0 and a.outstanding_requests == 0
