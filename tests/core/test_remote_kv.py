"""Scheduler side of disaggregation: leases on the prefill side, the WAITING_FOR_REMOTE_KV
stage on the decode side (prefix hits load only missing blocks, preemption of running requests
while others wait for KV, aborts mid-load), with the fake executor's block contents moved as
the KV transfer would move them. Outputs must match one colocated run."""

from __future__ import annotations

import pytest

from cadence.core.request import RequestStatus
from cadence.executor.fake_executor import FakeExecutor
from tests.core.core_driver import EOS, VOCAB, make_request, make_scheduler


def _step(sched, fake):
    plan = sched.schedule()
    out = fake.execute(plan) if not plan.is_empty else None
    from cadence.core.plan import StepOutput

    ups = sched.update(plan, out or StepOutput(plan.step_id))
    sched.check_integrity()
    return plan, ups


def _prefill(sched, fake, req_id, prompt, max_tokens):
    """Prefill side: compute the prompt and the first token, keep the blocks leased."""
    req = make_request(req_id, prompt, max_tokens=1)
    req.hold_kv_on_finish = True
    sched.add_request(req)
    for _ in range(100):
        _, ups = _step(sched, fake)
        for u in ups:
            if u.req_id == req_id and u.finished:
                assert u.finish_reason == "length"
                return u.new_token_ids[0] if u.new_token_ids else req.output_token_ids[0]
    raise AssertionError("prefill did not finish")


def _decode_request(req_id, prompt, first_token, max_tokens):
    req = make_request(req_id, prompt, max_tokens=max_tokens)
    req.append_output_token(first_token)
    return req


def _serve_loads(dec, fake_p, fake_d, sched_p, leases, loaded_blocks):
    for load in dec.take_kv_loads():
        remote = sched_p.kv.leased_blocks(load.req_id)
        src = remote[load.first_remote_block:load.first_remote_block + len(load.local_block_ids)]
        fake_d.import_blocks(load.local_block_ids, fake_p.export_blocks(src))
        loaded_blocks[load.req_id] = len(load.local_block_ids)
        assert dec.get_request(load.req_id).status is RequestStatus.WAITING_FOR_REMOTE_KV
        assert dec.finish_remote_kv(load.req_id)
        assert sched_p.release_kv_lease(load.req_id)  # the ack
        leases.discard(load.req_id)


def _colocated(prompts, max_tokens, fake):
    return {rid: fake.reference_generate(p, max_tokens, stop_ids=(EOS,))
            for rid, p in prompts.items()}


@pytest.mark.parametrize("decode_blocks", [256, 9])
def test_disaggregated_matches_colocated(decode_blocks):
    block_size = 4
    # Shorter than a block, exactly blocks, a shared prefix (decode-side hits), long ones.
    shared = list(range(3, 3 + 12))
    prompts = {"a": [5, 6], "b": list(range(10, 18)), "c": shared + [40, 41],
               "d": shared + [42, 43, 44], "e": list(range(20, 39))}
    max_tokens = 12
    fake_p, fake_d = FakeExecutor(VOCAB), FakeExecutor(VOCAB)
    ref = _colocated(prompts, max_tokens, FakeExecutor(VOCAB))
    pre = make_scheduler(block_size=block_size, budget=16)
    dec = make_scheduler(block_size=block_size, budget=16, num_blocks=decode_blocks,
                         max_seqs=4)
    leases, loaded = set(), {}
    outputs: dict[str, list[int]] = {}
    for rid, prompt in prompts.items():
        t0 = _prefill(pre, fake_p, rid, prompt, max_tokens)
        leases.add(rid)
        assert pre.kv.leased_blocks(rid) is not None
        outputs[rid] = [t0]
        if t0 == EOS:
            pre.release_kv_lease(rid)
            continue
        dec.add_remote_request(_decode_request(rid, prompt, t0, max_tokens))
        if rid == "c":  # let c finish loading before d arrives: d then hits c's prefix
            for _ in range(3):
                for u in _step(dec, fake_d)[1]:
                    outputs[u.req_id].extend(u.new_token_ids)
                _serve_loads(dec, fake_p, fake_d, pre, leases, loaded)
    for _ in range(500):
        if not dec.has_unfinished():
            break
        _, ups = _step(dec, fake_d)
        for u in ups:
            outputs[u.req_id].extend(u.new_token_ids)
        _serve_loads(dec, fake_p, fake_d, pre, leases, loaded)
    assert not dec.has_unfinished()
    assert outputs == ref
    # d found c's first three full blocks in the decode-side prefix cache: one block loaded.
    if decode_blocks == 256:
        assert loaded["d"] == 1 and loaded["c"] == 4
    else:
        assert dec.num_preemptions_total > 0  # running requests preempted while others load
    assert pre.kv.num_leased_blocks == 0 and pre.stats().num_blocks_used == 0
    assert dec.stats().num_blocks_used == 0
    pre.check_integrity()
    dec.check_integrity()


def test_abort_while_loading_and_lease_release():
    pre = make_scheduler(block_size=4)
    dec = make_scheduler(block_size=4)
    fake_p, fake_d = FakeExecutor(VOCAB), FakeExecutor(VOCAB)
    t0 = _prefill(pre, fake_p, "x", list(range(5, 15)), 8)
    assert pre.stats().num_leased_blocks == 3
    dec.add_remote_request(_decode_request("x", list(range(5, 15)), t0, 8))
    _step(dec, fake_d)
    loads = dec.take_kv_loads()
    assert [len(l.local_block_ids) for l in loads] == [3]
    assert dec.stats().num_waiting_for_kv == 1
    assert dec.abort_request("x")
    _, ups = _step(dec, fake_d)
    assert [(u.req_id, u.finish_reason) for u in ups] == [("x", "abort")]
    assert not dec.finish_remote_kv("x")  # the late transfer is ignored
    assert dec.stats().num_blocks_used == 0
    # Lease expiry on the prefill side: the engine releases it; double release is refused.
    assert pre.release_kv_lease("x") and not pre.release_kv_lease("x")
    assert pre.stats().num_blocks_used == 0
    pre.check_integrity()
    dec.check_integrity()


def test_remote_request_validation():
    dec = make_scheduler()
    with pytest.raises(ValueError):
        dec.add_remote_request(make_request("y", [1, 2, 3]))  # no first token
    req = _decode_request("y", [1, 2, 3], 7, 4)
    dec.add_remote_request(req)
    with pytest.raises(ValueError):
        dec.add_remote_request(_decode_request("y", [1, 2, 3], 7, 4))


def test_aborted_prefill_frees_instead_of_leasing():
    pre = make_scheduler(block_size=4)
    req = make_request("z", list(range(5, 15)), max_tokens=1)
    req.hold_kv_on_finish = True
    pre.add_request(req)
    pre.schedule()
    pre.abort_request("z")
    assert pre.stats().num_blocks_used == 0 and pre.kv.num_leases == 0


def test_waits_only_on_remote_kv_when_blocks_are_leased():
    # One pool plays both roles: a lease holds most blocks, a prefilled request waits for
    # them; the engine may block (nothing to step) until the lease is released.
    sched = make_scheduler(block_size=4, num_blocks=4)
    fake = FakeExecutor(VOCAB)
    t0 = _prefill(sched, fake, "held", list(range(5, 15)), 8)  # 3 blocks leased
    sched.add_remote_request(_decode_request("r", list(range(20, 28)), t0, 4))
    assert sched.waits_only_on_remote_kv()
    _step(sched, fake)
    assert sched.take_kv_loads() == [] and sched.waits_only_on_remote_kv()
    sched.release_kv_lease("held")
    assert not sched.waits_only_on_remote_kv()  # its blocks are free: a step admits it
    _step(sched, fake)
    assert [len(l.local_block_ids) for l in sched.take_kv_loads()] == [2]
    assert sched.waits_only_on_remote_kv()  # now loading
