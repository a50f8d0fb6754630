"""In-process disaggregated engines over one loaded tiny model: a prefill core and a decode
core (DisaggEngineCore) whose KV moves over the real ZeroMQ transport, driven the way the
engine loop drives them (service, step; block on the wake-up socket while only transfers run)."""

from __future__ import annotations

import time

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.disagg.config import DisaggConfig
from cadence.disagg.worker import DisaggEngineCore
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.llm_engine_adapter import LLMEngineAdapter

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_core(loaded, role, *, num_blocks=None, block_size=4, budget=64, max_seqs=8,
              address=None, lease_timeout_s=30.0, transfer_timeout_s=5.0, policy="chunked",
              trace_path=None, kv_dtype="auto", **sched):
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=budget,
                                  max_num_seqs=max_seqs, **sched),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks or 256),
        trace_path=trace_path, kv_cache_dtype=kv_dtype)
    engine = LLMEngine.from_loaded(loaded, cfg)
    return DisaggEngineCore(
        LLMEngineAdapter(engine, "tiny"),
        DisaggConfig(role=role, kv_transfer_address=address, kv_lease_timeout_s=lease_timeout_s,
                     kv_transfer_timeout_s=transfer_timeout_s))


def drive(core, outputs, deadline_s=30.0):
    """Step until nothing is unfinished; collect outputs per request."""
    import zmq

    deadline = time.monotonic() + deadline_s
    while core.has_unfinished():
        assert time.monotonic() < deadline, "engine did not finish"
        core.service()
        if core.waits_only_on_transfers():
            if core.wakeup_socket.poll(200, zmq.POLLIN):
                core.wakeup_socket.recv()
            continue
        for out in core.step():
            outputs.setdefault(out.req_id, []).append(out)
        core.scheduler.check_integrity()
    return outputs


def prefill(core, req_id, ids, params=GREEDY):
    core.add_request(req_id, ids, params, 0, None, kv_transfer_params={"do_remote_decode": True})
    outs = drive(core, {})[req_id]
    assert outs[-1].finished
    return outs[-1]


def tokens(outs):
    return [t for o in outs for t in o.new_token_ids]


def colocated(loaded, prompts, params=GREEDY, kv_dtype="auto"):
    core = make_core(loaded, "both", block_size=16, kv_dtype=kv_dtype)
    for i, ids in enumerate(prompts):
        core.add_request(f"c{i}", ids, params, 0, None)
    outs = drive(core, {})
    return [tokens(outs[f"c{i}"]) for i in range(len(prompts))]
