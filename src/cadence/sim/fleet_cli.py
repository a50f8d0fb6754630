"""`cadence sim --replicas N[,N...]`: N simulated replicas behind each router policy on a
multi-turn conversation workload (sim/fleet.py), or, with --compare RESULTS.json, the
conversations a benchmarks/replica_bench.py run measured replayed in the simulator next to what
was measured (prefix hit rate, TTFT p50/p99 and the p50's error)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex

from rich.console import Console
from rich.table import Table

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.conversations import from_replica_bench, synthetic
from cadence.sim.cost_model import CostModel
from cadence.sim.fleet import FleetResult, simulate_fleet
from cadence.sim.host_cpu import HostCpu, host_from_run
from cadence.sim.run_speed import PacedCostModel, measure_run_speed
from cadence.sim.step_jitter import StepJitter

POLICIES = ("round-robin", "least-loaded", "cache-aware")
# Blocks per replica when nothing says (the engines' default pool holds far more than these
# workloads: no eviction).
UNBOUNDED_KV_BLOCKS = 1 << 16
DEFAULT_HOP_MS = 15.0


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("replica fleet (multi-turn conversations)")
    fleet.add_argument("--replicas", default=None, metavar="N[,N...]",
                       help="simulate N replicas behind the router instead of policies on one "
                            "engine (e.g. 2,16,64)")
    fleet.add_argument("--routing-policies", default=",".join(POLICIES),
                       help="replica policies to compare (default: all three)")
    fleet.add_argument("--compare", metavar="RESULTS.json", default=None,
                       help="replay the conversations of a benchmarks/replica_bench.py run "
                            "(its replica counts and policies) and print the simulator's error")
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
    fleet.add_argument("--slo-ttft", type=float, default=1.0, help="goodput: TTFT <= this (s)")
    fleet.add_argument("--calibrate-rounds", type=int, default=5,
                       help="with --calibrate: timed rounds of the profile (default: 5)")
    fleet.add_argument("--threads", type=int, default=None,
                       help="with --calibrate: threads to profile with (one replica's share of "
                            "the cores: replica_bench gives each of N replicas cores/N)")


def _kv_blocks_of(args_of_run: dict) -> int | None:
    words = shlex.split(args_of_run.get("serve_args") or "")
    if "--num-kv-blocks" in words:
        return int(words[words.index("--num-kv-blocks") + 1])
    return None


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.0f}" if value is not None else "-"


def run_fleet(args: argparse.Namespace, cost_model: CostModel,
              calibration: list | None, rounds: list | None = None) -> int:
    console = Console(width=160)
    sched = SchedulerConfig()
    hop = (args.hop_ms if args.hop_ms is not None else DEFAULT_HOP_MS) / 1e3
    rows_json = []
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            measured = json.load(f)
        blocks = args.kv_blocks or _kv_blocks_of(measured["args"]) or UNBOUNDED_KV_BLOCKS
        cache = CacheConfig(block_size=16, num_blocks=blocks)
        table = Table(title=f"simulator vs measured ({args.compare}; {cost_model.name}; "
                            f"{blocks} KV blocks per replica)")
        for col in ("replicas", "policy", "hop ms", "hit real", "hit sim", "TTFT p50 real",
                    "sim", "error", "p99 real", "sim"):
            table.add_column(col, justify="right")
        for row in measured["results"]:
            workload = from_replica_bench(row)
            # The run's own hop where it was measured (it differs by policy: cache-aware's
            # router tokenizes each prompt first), unless --hop-ms says.
            hop = (args.hop_ms / 1e3 if args.hop_ms is not None else
                   row.get("hop_s") if row.get("hop_s") is not None else DEFAULT_HOP_MS / 1e3)
            host, row_cost = None, cost_model
            if args.host_cpu:
                host, row_cost = run_host(row, cost_model)
                if host is not None:
                    console.print(f"{row['replicas']} x {row['policy']}: {row_cost.name}; "
                                  f"{host.describe()}")
            sim = median_run([
                simulate_fleet(workload, row["replicas"], row["policy"], row_cost, sched, cache,
                               args.cache_load_weight, hop, calibration=calibration, host=host,
                               jitter=j)
                for j in jitters(rounds, getattr(args, "sim_seeds", 0))])
            real_p50 = row["ttft_p50"]
            error = (sim.ttft_p50 - real_p50) / real_p50 if real_p50 and sim.ttft_p50 else None
            table.add_row(str(row["replicas"]), row["policy"], f"{hop * 1e3:.0f}",
                          f"{row['prefix_hit_rate']:.3f}",
                          f"{sim.prefix_hit_rate:.3f}", _ms(real_p50), _ms(sim.ttft_p50),
                          f"{error:+.0%}" if error is not None else "-", _ms(row["ttft_p99"]),
                          _ms(sim.ttft_percentile(0.99)))
            rows_json.append({"replicas": row["replicas"], "policy": row["policy"],
                              "hop_s": hop, "host": host.describe() if host else None, "real": {"hit": row["prefix_hit_rate"], "ttft_p50": real_p50,
                                       "ttft_p99": row["ttft_p99"]},
                              "sim": _summary(sim, args.slo_ttft), "ttft_p50_error": error})
        console.print(table)
    else:
        workload = synthetic(args.conversations, args.rate, args.systems, args.conv_system_tokens,
                             args.conv_doc_tokens, args.conv_user_tokens, args.conv_answer_tokens,
                             think_mean_s=args.think_s, seed=args.seed)
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
                                  "sim": _summary(sim, args.slo_ttft)})
        console.print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows_json}, f, indent=2)
    return 0


def jitters(rounds: list | None, seeds: int) -> list[StepJitter | None]:
    """One StepJitter per seed from the profile's rounds, or [None] (a single run on the
    median step times) without 3+ rounds to draw from."""
    jitter = StepJitter.from_rounds(rounds or [])
    if jitter is None or seeds <= 0:
        return [None]
    return [jitter.reseeded(seed) for seed in range(seeds)]


def median_run(sims: list[FleetResult]) -> FleetResult:
    """The run whose TTFT p50 is the median of the runs' (one run's own numbers throughout)."""
    ranked = sorted(sims, key=lambda r: r.ttft_p50 if r.ttft_p50 is not None else math.inf)
    return ranked[(len(ranked) - 1) // 2]


def run_host(row: dict, cost_model: CostModel) -> tuple[HostCpu | None, CostModel]:
    """What a replica_bench.py row measured about its host, for its replay: the cores and the
    stack's CPU (host_cpu.host_from_run), the replicas' pace against the profile and their
    slowdown beside each other (run_speed.py; the co-run term only where each replica has
    cores of its own), and the engine loop's work per step beyond the forward
    (engine_step_overhead_s). Rows without these give (None, cost_model)."""
    host = host_from_run(row)
    overhead = sum((row.get("engine_step_overhead_s") or {}).values())
    speed = measure_run_speed(row.get("step_sample") or [], cost_model)
    if speed is not None or overhead:
        cost_model = PacedCostModel(cost_model, speed.alone if speed else 1.0, overhead)
    if host is not None and speed is not None and (
            row["replicas"] * host.threads_per_replica <= host.cores):
        host = dataclasses.replace(host, corun_slowdown=speed.corun_slowdown(host))
    return host, cost_model


def _summary(sim: FleetResult, slo_ttft: float) -> dict:
    return {"hit": sim.prefix_hit_rate, "ttft_p50": sim.ttft_p50,
            "ttft_p99": sim.ttft_percentile(0.99), "goodput_rps": sim.goodput_rps(slo_ttft),
            "preemptions": sim.preemptions, "per_replica": sim.per_replica()}
