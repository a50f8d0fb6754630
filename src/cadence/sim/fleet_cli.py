"""`cadence sim --replicas N[,N...]`: N simulated replicas behind each router policy on a
multi-turn conversation workload (sim/fleet.py), or, with --compare RESULTS.json..., the
conversations benchmarks/replica_bench.py runs measured replayed in the simulator next to what
was measured (prefix hit rate, TTFT p50/p99 and the p50's error; with several runs the median
p50s too: sim/fleet_compare.py)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.conversations import synthetic
from cadence.sim.cost_model import CostModel
from cadence.sim.fleet import simulate_fleet
from cadence.sim.fleet_compare import (DEFAULT_HOP_MS, UNBOUNDED_KV_BLOCKS, RunProfile,
                                       compare_runs, summary)
from cadence.sim.host_cpu import HostCpu
from cadence.sim.think_time import add_think_arguments

POLICIES = ("round-robin", "least-loaded", "cache-aware")


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("replica fleet (multi-turn conversations)")
    fleet.add_argument("--replicas", default=None, metavar="N[,N...]",
                       help="simulate N replicas behind the router instead of policies on one "
                            "engine (e.g. 2,16,64)")
    fleet.add_argument("--routing-policies", default=",".join(POLICIES),
                       help="replica policies to compare (default: all three)")
    fleet.add_argument("--compare", metavar="RESULTS.json", nargs="+", default=None,
                       help="replay the conversations of a benchmarks/replica_bench.py run "
                            "(its replica counts and policies) and print the simulator's error; "
                            "with several runs also the median measured TTFT p50 against the "
                            "median simulated one (give --calibration one profile per run, in "
                            "the same order, or one for all)")
    fleet.add_argument("--kv-blocks", type=int, default=None,
                       help="KV blocks per replica (default: the run's --num-kv-blocks with "
                            "--compare, else unbounded)")
    fleet.add_argument("--cache-load-weight", type=float, default=0.25,
                       help="cache-aware's load weight (as `cadence router`)")
    fleet.add_argument("--hop-ms", type=float, default=None,
                       help="time outside the engines per request: client -> router "
                            "(/tokenize) -> replica -> first token back (default: with "
                            "--compare each run's measured hop, the client's TTFT less the "
                            "replicas' own; else 15)")
    fleet.add_argument("--no-host-cpu", dest="host_cpu", action="store_false",
                       help="with --compare: give every replica cores of its own (by default "
                            "the replicas share the run's cores with the stack around them, "
                            "at the CPU it measured: sim/host_cpu.py, and each step carries "
                            "the engine loop's measured work beyond the forward)")
    fleet.add_argument("--sim-seeds", type=int, default=7,
                       help="with --compare and a profile with 3+ rounds: simulate each run "
                            "this many times, each step's time drawn from the profile's "
                            "spread, and report the run of median TTFT p50 (near saturation "
                            "one run's p50 moves with a few steps' luck); 0: median step times")
    fleet.add_argument("--host-cores", type=float, default=None,
                       help="without --compare: the replicas share this many cores (one "
                            "engine thread each; none of the stack's CPU) instead of one "
                            "core of their own each")
    fleet.add_argument("--conversations", type=int, default=64)
    fleet.add_argument("--rate", type=float, default=2.0, help="conversations started per second")
    fleet.add_argument("--systems", type=int, default=3, help="shared system prompts")
    fleet.add_argument("--conv-system-tokens", type=int, default=50)
    fleet.add_argument("--conv-doc-tokens", type=int, default=450,
                       help="a document per conversation, on its first turn")
    fleet.add_argument("--conv-user-tokens", type=int, default=30)
    fleet.add_argument("--conv-answer-tokens", type=int, default=32)
    fleet.add_argument("--think-s", type=float, default=0.3,
                       help="mean think time between an answer and the next turn")
    add_think_arguments(fleet)
    fleet.add_argument("--slo-ttft", type=float, default=1.0, help="goodput: TTFT <= this (s)")
    fleet.add_argument("--calibrate-rounds", type=int, default=5,
                       help="with --calibrate: timed rounds of the profile (default: 5)")
    fleet.add_argument("--threads", type=int, default=None,
                       help="with --calibrate: threads to profile with (one replica's share of "
                            "the cores: replica_bench gives each of N replicas cores/N)")


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.0f}" if value is not None else "-"


def run_fleet(args: argparse.Namespace, cost_model: CostModel,
              calibration: list | None, rounds: list | None = None,
              profiles: list[RunProfile] | None = None) -> int:
    """The fleet table: --compare's measured runs replayed (each priced by its own entry of
    `profiles` when given, else all by `cost_model`), or --replicas on a synthetic workload."""
    console = Console(width=160)
    sched = SchedulerConfig()
    hop = (args.hop_ms if args.hop_ms is not None else DEFAULT_HOP_MS) / 1e3
    rows_json = []
    if args.compare:
        rows_json = compare_runs(args.compare, profiles or [
            RunProfile(cost_model, calibration, rounds)] * len(args.compare), args, console)
    else:
        workload = synthetic(args.conversations, args.rate, args.systems, args.conv_system_tokens,
                             args.conv_doc_tokens, args.conv_user_tokens, args.conv_answer_tokens,
                             think_mean_s=args.think_s, seed=args.seed,
                             think_dist=args.think_dist, think_spread=args.think_spread)
        cache = CacheConfig(block_size=16, num_blocks=args.kv_blocks or UNBOUNDED_KV_BLOCKS)
        table = Table(title=f"{args.conversations} conversations at {args.rate:g}/s "
                            f"({workload.num_requests} requests); {cost_model.name}; "
                            f"{cache.num_blocks} KV blocks per replica")
        for col in ("replicas", "policy", "prefix hit", "TTFT p50 (ms)", "p99 (ms)",
                    "goodput (req/s)", "preemptions", "requests per replica (min-max)"):
            table.add_column(col, justify="right")
        for n in (int(x) for x in args.replicas.split(",")):
            host = HostCpu(args.host_cores) if args.host_cores else None
            for policy in args.routing_policies.split(","):
                sim = simulate_fleet(workload, n, policy, cost_model, sched, cache,
                                     args.cache_load_weight, hop, calibration=calibration,
                                     host=host)
                counts = sim.per_replica()
                table.add_row(str(n), policy, f"{sim.prefix_hit_rate:.3f}", _ms(sim.ttft_p50),
                              _ms(sim.ttft_percentile(0.99)),
                              f"{sim.goodput_rps(args.slo_ttft):.2f}", str(sim.preemptions),
                              f"{min(counts)}-{max(counts)}")
                rows_json.append({"replicas": n, "policy": policy,
                                  "sim": summary(sim, args.slo_ttft)})
        console.print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows_json}, f, indent=2)
    return 0
