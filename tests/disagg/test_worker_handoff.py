"""Prefill and decode engines hand requests over through the real KV transport: greedy fp32
tokens equal a colocated run (IPC and TCP; prompts shorter than a block; decode-side prefix hits
that pull only the missing blocks; preemption while others wait for KV); leases freed on the
decode side's release, on expiry, and when the decode side aborts before its pull."""

from __future__ import annotations

import json
import time

import pytest

from cadence.model.loader import load_model
from tests.disagg.core_harness import GREEDY, colocated, drive, make_core, prefill, tokens


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


SHARED = "Continuous batching mixes prefill chunks with decode steps. "


@pytest.fixture(scope="module")
def prompts(tiny):
    enc = tiny.tokenizer.encode
    return [enc("Hi"),                           # shorter than one block (block_size 4)
            enc(SHARED + "The quick brown fox"),
            enc(SHARED + "Hello world! How are"),  # shares full blocks with the previous one
            enc("Paged attention stores keys and values in fixed-size blocks. " * 2)]


@pytest.fixture(scope="module")
def reference(tiny, prompts):
    return colocated(tiny, prompts)


def _handoff(pre, dec, prompts, reference, ids_prefix="r"):
    outs = {}
    for i, ids in enumerate(prompts):
        rid = f"{ids_prefix}{i}"
        done = prefill(pre, rid, ids)
        params = done.kv_transfer_params
        assert params["do_remote_prefill"] and params["first_token_id"] == done.new_token_ids[0]
        dec.add_request(rid, ids, GREEDY, 0, None, kv_transfer_params=params)
        if i == 1:  # let the shared prefix land in the decode cache before its sibling
            drive(dec, outs)
    drive(dec, outs)
    got = [tokens(outs[f"{ids_prefix}{i}"]) for i in range(len(prompts))]
    assert got == reference
    return outs


def test_float16_pools_hand_over_half_the_bytes(tiny, prompts):
    # What auto gives a GGUF model on both roles: the transfer moves the pool's 16-bit blocks
    # as they are (the layout names the dtype), tokens as a colocated float16 run.
    reference = colocated(tiny, prompts, kv_dtype="float16")
    sent = {}
    for kv_dtype in ("float16", "float32"):
        pre = make_core(tiny, "prefill", kv_dtype=kv_dtype)
        dec = make_core(tiny, "decode", kv_dtype=kv_dtype)
        try:
            outs = _handoff(pre, dec, prompts, reference if kv_dtype == "float16" else colocated(tiny, prompts))
            assert outs["r0"][-1].kv_transfer_params["transfer_blocks"] == 1
            sent[kv_dtype] = outs["r0"][-1].kv_transfer_params["transfer_bytes"]
        finally:
            pre.close()
            dec.close()
    assert 2 * sent["float16"] == sent["float32"]


@pytest.mark.parametrize("address", [None, "tcp://127.0.0.1:0"], ids=["ipc", "tcp"])
def test_one_prefill_one_decode_match_colocated(tiny, prompts, reference, address, tmp_path):
    trace = tmp_path / "decode-trace.jsonl"
    pre = make_core(tiny, "prefill", address=address)
    dec = make_core(tiny, "decode", trace_path=str(trace))
    try:
        outs = _handoff(pre, dec, prompts, reference)
        rec = {rid: o[-1].kv_transfer_params for rid, o in outs.items()}
        # r2 found r1's shared full blocks in the decode-side prefix cache: it pulled fewer.
        assert rec["r2"]["local_prefix_hit_tokens"] > 0
        assert rec["r2"]["transfer_blocks"] < -(-len(prompts[2]) // 4)
        assert rec["r0"]["transfer_blocks"] == 1 and rec["r0"]["transfer_bytes"] > 0
        # Every lease was released by the decode side's acknowledgement.
        deadline = time.monotonic() + 30
        while pre.scheduler.stats().num_blocks_used and time.monotonic() < deadline:
            pre.service()
            time.sleep(0.01)
        assert pre.scheduler.stats().num_blocks_used == 0 and len(pre.leases) == 0
        assert dec.scheduler.stats().num_blocks_used == 0
        assert dec.stats()["kv_transfers_total"] == 4
        assert dec.stats()["kv_transfer_bytes_total"] == pre.stats()["kv_bytes_served_total"]
        pre.scheduler.check_integrity()
        dec.scheduler.check_integrity()
    finally:
        pre.close()
        dec.close()
    # Every transfer is in the decode engine's trace, with its bytes and seconds.
    records = [json.loads(line) for line in open(trace)]
    transfers = {r["req_id"]: r for r in records if r["type"] == "kv_transfer"}
    assert set(transfers) == {"r0", "r1", "r2", "r3"}
    assert transfers["r0"]["transfer_bytes"] > 0 and transfers["r0"]["transfer_s"] > 0


def test_two_prefill_workers_one_decode(tiny, prompts, reference):
    pres = [make_core(tiny, "prefill"), make_core(tiny, "prefill", address="tcp://127.0.0.1:0")]
    dec = make_core(tiny, "decode")
    try:
        outs = {}
        for i, ids in enumerate(prompts):
            done = prefill(pres[i % 2], f"q{i}", ids)
            dec.add_request(f"q{i}", ids, GREEDY, 0, None,
                            kv_transfer_params=done.kv_transfer_params)
        drive(dec, outs)
        assert [tokens(outs[f"q{i}"]) for i in range(len(prompts))] == reference
    finally:
        for c in (*pres, dec):
            c.close()


def test_preemption_while_waiting_for_kv(tiny, prompts, reference):
    # A decode pool too small for all four: running requests get preempted (and recomputed
    # locally) while later ones wait for blocks and for their KV.
    pre = make_core(tiny, "prefill")
    dec = make_core(tiny, "decode", num_blocks=20, budget=16)
    sched = dec.scheduler
    ids_all = [f"p{i}" for i in range(len(prompts))]
    # Per step: did a preemption happen while a request still waited for its KV (queued for
    # blocks to pull into, or loading)? Which remotely prefilled requests were preempted
    # (their prompt and outputs then recomputed locally)?
    preempted_while_waiting, preempted_remote = 0, set()
    step = dec.step

    def watched_step():
        nonlocal preempted_while_waiting
        waiting, before = len(sched.remote), sched.num_preemptions_total
        outs = step()
        if sched.num_preemptions_total > before and waiting:
            preempted_while_waiting += 1
        for rid in ids_all:
            req = sched.get_request(rid)
            if req is not None and req.num_preemptions:
                preempted_remote.add(rid)
        return outs

    dec.step = watched_step
    try:
        outs = {}
        for i, ids in enumerate(prompts):
            done = prefill(pre, f"p{i}", ids)
            dec.add_request(f"p{i}", ids, GREEDY, 0, None,
                            kv_transfer_params=done.kv_transfer_params)
        drive(dec, outs)
        assert [tokens(outs[f"p{i}"]) for i in range(len(prompts))] == reference
        assert sched.stats().num_preemptions_total > 0
        assert preempted_while_waiting > 0, "no preemption while a request waited for its KV"
        assert preempted_remote, "no remotely prefilled request was preempted"
        assert sched.stats().num_blocks_used == 0
    finally:
        pre.close()
        dec.close()


def test_lease_expiry_and_abort_before_pull(tiny, prompts, tmp_path):
    pre = make_core(tiny, "prefill", lease_timeout_s=0.3)
    dec = make_core(tiny, "decode")
    try:
        # 1. Nobody pulls: the lease expires and frees the blocks.
        prefill(pre, "e1", prompts[3])
        assert pre.scheduler.stats().num_leased_blocks > 0
        time.sleep(0.35)
        pre.service()
        assert pre.scheduler.stats().num_blocks_used == 0
        assert pre.stats()["kv_leases_expired_total"] == 1
        pre.scheduler.check_integrity()
        # 2. Too late: the decode side's pull of an expired lease ends the request with an
        # explicit error (after its first token), and its blocks are freed.
        done = prefill(pre, "e2", prompts[1])
        time.sleep(0.35)
        pre.service()
        dec.add_request("e2", prompts[1], GREEDY, 0, None,
                        kv_transfer_params=done.kv_transfer_params)
        outs = drive(dec, {})
        assert outs["e2"][-1].finish_reason == "error"
        assert "KV transfer" in outs["e2"][-1].error and "no live lease" in outs["e2"][-1].error
        assert dec.stats()["kv_transfer_failures_total"] == 1
        # 3. The decode side aborts before its pull: its release frees the prefill's lease.
        done = prefill(pre, "a1", prompts[3])
        dec.add_request("a1", prompts[3], GREEDY, 0, None,
                        kv_transfer_params=done.kv_transfer_params)
        dec.abort_request("a1")
        outs = drive(dec, {})
        assert outs["a1"][-1].finished and outs["a1"][-1].finish_reason == "abort", outs
        deadline = time.monotonic() + 30
        while pre.scheduler.stats().num_blocks_used and time.monotonic() < deadline:
            pre.service()
            time.sleep(0.01)
        assert pre.scheduler.stats().num_blocks_used == 0
        assert dec.scheduler.stats().num_blocks_used == 0
        pre.scheduler.check_integrity()
        dec.scheduler.check_integrity()
    finally:
        pre.close()
        dec.close()


def test_short_prompt_interjected_into_a_long_prefill_is_handed_off(tiny, prompts, reference):
    # A short prompt that reaches the prefill worker while a long prompt's step computes runs
    # between two of its layers (the loop's emit hook sends its output at once). It must come
    # out as a handoff like any other, its blocks leased for the decode worker: not as a
    # finished one-token answer with its blocks held for ever.
    pre = make_core(tiny, "prefill", budget=512, max_num_partial_prefills=2,
                    max_model_len=1000)
    dec = make_core(tiny, "decode")
    emitted = []
    added = []

    def poll():
        if not added:
            added.append(True)
            pre.add_request("short", prompts[0], GREEDY, 0, None,
                            kv_transfer_params={"do_remote_decode": True})

    pre.set_interjection_hooks(poll, emitted.extend)
    try:
        long_ids = (prompts[3] * 12)[:200]
        pre.add_request("long", long_ids, GREEDY, 0, None,
                        kv_transfer_params={"do_remote_decode": True})
        outs = pre.step()
        assert pre.scheduler.num_interjections_total == 1
        assert [o.req_id for o in emitted] == ["short"] and emitted[0].finished
        params = emitted[0].kv_transfer_params
        assert params is not None and params["do_remote_prefill"], emitted[0]
        assert len(pre.leases) == 2  # both prompts whole in this step, both leased
        assert [o.req_id for o in outs if o.finished] == ["long"]
        assert outs[-1].kv_transfer_params["do_remote_prefill"]
        dec.add_request("short", prompts[0], GREEDY, 0, None, kv_transfer_params=params)
        got = drive(dec, {})
        assert tokens(got["short"]) == reference[0]
        # The short prompt's lease was released by the decode side; the long one's expires
        # or is released the same way: no block is held by a finished request.
        dec.add_request("long", long_ids, GREEDY, 0, None,
                        kv_transfer_params=outs[-1].kv_transfer_params)
        drive(dec, {})
        deadline = time.monotonic() + 30
        while pre.scheduler.stats().num_blocks_used and time.monotonic() < deadline:
            pre.service()
            time.sleep(0.01)
        assert pre.scheduler.stats().num_blocks_used == 0 and len(pre.leases) == 0
        pre.scheduler.check_integrity()
    finally:
        pre.close()
        dec.close()


def test_role_checks(tiny, prompts):
    dec = make_core(tiny, "decode")
    try:
        with pytest.raises(ValueError, match="role is decode"):
            dec.add_request("x", prompts[0], GREEDY, 0, None,
                            kv_transfer_params={"do_remote_decode": True})
        with pytest.raises(ValueError, match="lacks a valid"):
            dec.add_request("y", prompts[0], GREEDY, 0, None,
                            kv_transfer_params={"do_remote_prefill": True})
    finally:
        dec.close()
