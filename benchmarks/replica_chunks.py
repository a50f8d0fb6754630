"""Prompt chunks per request: what the replicas' engines did (their --trace files) against what
the fleet simulator's schedulers do on the same run's replay (`cadence sim --compare`'s setup,
one deterministic run, no step jitter).

Why: the simulator's TTFT for the mostly-cached turns of a multi-turn chat (least-loaded's and
cache-aware's median request) is set by how many steps their uncached tail is prefilled in, and
that is the slo policy's floor plan, which each engine makes from its own startup profile while
the simulated schedulers make it from the pricing profile unless the run recorded the engines'
startup profiles (their trace meta lines; docs/performance.md, "Replicas and routing": workload
P's least-loaded). Prints, per policy and by uncached tokens, the requests
and their mean chunks, real and simulated.

    PYTHONPATH=src .venv/bin/python benchmarks/replica_chunks.py --run /tmp/h4/p1
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.scheduler import Scheduler
from cadence.sim.cli import _saved_profile
from cadence.sim.conversations import from_replica_bench
from cadence.sim.fleet import simulate_fleet
from cadence.sim.fleet_compare import engine_calibrations, kv_blocks_of, run_host

MISS_BIN = 200  # uncached tokens per row of the table


def real_chunks(run: str, replicas: int, ids: set[str]) -> dict[str, list[int]]:
    """req_id -> its prompt chunks' tokens, from the replicas' traces (trace-N.i.jsonl)."""
    chunks: dict[str, list[int]] = collections.defaultdict(list)
    for i in range(replicas):
        with open(f"{run}/trace-{replicas}.{i}.jsonl", encoding="utf-8") as f:
            for line in f:
                step = json.loads(line)
                if step.get("type") != "step":
                    continue
                for rid, n in zip(step.get("prefill_req_ids") or [],
                                  step.get("prefill_chunk_tokens") or []):
                    if rid in ids:
                        chunks[rid].append(n)
    return chunks


def sim_chunks(row: dict, profile, cache: CacheConfig) -> dict[str, list[int]]:
    """req_id -> its prompt chunks' tokens in the fleet simulation of `row` (the schedulers'
    plans, interjections included)."""
    chunks: dict[str, list[int]] = collections.defaultdict(list)
    schedule, interject = Scheduler.schedule, Scheduler.schedule_interjection

    def note(plan):
        for c in plan.chunks if plan is not None else ():
            if c.is_prefill:
                chunks[c.req_id].append(c.num_new_tokens)
        return plan

    Scheduler.schedule = lambda self, *a, **k: note(schedule(self, *a, **k))
    Scheduler.schedule_interjection = lambda self, *a, **k: note(interject(self, *a, **k))
    try:
        host, cost = run_host(row, profile.cost_model)
        simulate_fleet(from_replica_bench(row), row["replicas"], row["policy"], cost,
                       SchedulerConfig(), cache, hop_s=row.get("hop_s") or 0.0,
                       calibration=profile.calibration, host=host,
                       replica_calibrations=engine_calibrations(row, cache.block_size))
    finally:
        Scheduler.schedule, Scheduler.schedule_interjection = schedule, interject
    return chunks


def by_miss(chunks: dict[str, list[int]]) -> dict[int, list[int]]:
    """Uncached-token bin -> chunk counts of the requests in it."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for sizes in chunks.values():
        out[min(sum(sizes) // MISS_BIN, 5)].append(len(sizes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a replica_bench.py --out folder with cal.json")
    args = ap.parse_args()
    profile = _saved_profile(f"{args.run}/cal.json")
    with open(f"{args.run}/results.json", encoding="utf-8") as f:
        measured = json.load(f)
    cache = CacheConfig(block_size=16, num_blocks=kv_blocks_of(measured["args"]) or 1 << 16)
    for row in measured["results"]:
        real = by_miss(real_chunks(args.run, row["replicas"],
                                   {r["id"] for r in row["records"]}))
        sim = by_miss(sim_chunks(row, profile, cache))
        print(f"{row['replicas']} x {row['policy']}: uncached tokens, requests real / sim, "
              "mean chunks real / sim")
        for b in sorted(set(real) | set(sim)):
            r, s = real.get(b, []), sim.get(b, [])
            label = f"{b * MISS_BIN}+" if b == 5 else f"{b * MISS_BIN}-{(b + 1) * MISS_BIN - 1}"
            print(f"  {label:>9}: {len(r):3d} / {len(s):3d}   "
                  f"{statistics.mean(r) if r else 0:.2f} / {statistics.mean(s) if s else 0:.2f}")


if __name__ == "__main__":
    main()
