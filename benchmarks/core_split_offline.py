"""Doc-burst in-process: 3 streams decoding, then a document; --core-split modes against
colocated slo and eager, each mode in its own process (a fresh engine, nothing carried over),
interleaved over --rounds.

    .venv/bin/python benchmarks/core_split_offline.py [--modes eager,off,auto,disjoint] [--rounds 2]

Per run: the document's TTFT, the streams' largest gap while it prefilled (eager: the stall
is the TTFT itself, the streams get no token until the document's step ends), the process's
CPU time over wall time (on a shared host: the share of the cores it actually got), the load
average. Default model, default flags but the mode.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time


def run_one(mode: str, doc_tokens: int, seed: int) -> dict:
    from cadence.core.config import CacheConfig, SchedulerConfig
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.loader import load_model

    loaded = load_model(None)
    policy, split = ("eager", "off") if mode == "eager" else ("slo", mode)
    cfg = EngineConfig(scheduler=SchedulerConfig(policy=policy, core_split=split),
                       cache=CacheConfig(kv_cache_memory_bytes=1 << 29), startup_profile=False)
    engine = LLMEngine.from_loaded(loaded, cfg)
    if split != "off":
        engine.enable_core_split()
    rng = random.Random(seed)
    streams = [f"s{i}" for i in range(3)]
    for req_id in streams:
        engine.add_request(req_id, [rng.randrange(100, 40000) for _ in range(30)],
                           SamplingParams(temperature=0.0, max_tokens=600, ignore_eos=True))
    while any(engine.scheduler.get_request(r).num_output_tokens < 3 for r in streams):
        engine.step()
    cpu0, t0 = os.times(), time.perf_counter()
    engine.add_request("doc", [rng.randrange(100, 40000) for _ in range(doc_tokens)],
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    last = dict.fromkeys(streams, t0)
    gap, ttft = 0.0, None
    while ttft is None:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.req_id == "doc" and out.new_token_ids:
                ttft = now - t0
            elif out.req_id in last and out.new_token_ids:
                gap = max(gap, now - last[out.req_id])
                last[out.req_id] = now
    cpu1 = os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    stepper = engine.split_stepper
    engine.close()
    return {"mode": mode, "doc_ttft_s": round(ttft, 3),
            "stream_max_gap_s": round(ttft if mode == "eager" else gap, 3),
            "cpu_per_wall": round(cpu / ttft, 2), "load": round(os.getloadavg()[0], 1),
            "overlapped_decode_steps": stepper.num_overlapped_decode_steps if stepper else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="eager,off,auto,disjoint")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--doc-tokens", type=int, default=1650)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: mode,seed
    args = parser.parse_args()
    if args.one:
        mode, seed = args.one.split(",")
        print(json.dumps(run_one(mode, args.doc_tokens, int(seed))))
        return 0
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", f"{mode},{r}",
                                  "--doc-tokens", str(args.doc_tokens)],
                                 capture_output=True, text=True, check=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
