"""`cadence sim --replicas N[,N...]`: N simulated replicas behind each router policy on a
multi-turn conversation workload (sim/fleet.py), or, with --compare RESULTS.json, the
conversations a benchmarks/replica_bench.py run measured replayed in the simulator next to what
was measured (prefix hit rate, TTFT p50/p99 and the p50's error)."""

from __future__ import annotations

import argparse
import json
import shlex

from rich.console import Console
from rich.table import Table

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.conversations import from_replica_bench, synthetic
from cadence.sim.cost_model import CostModel
from cadence.sim.fleet import FleetResult, simulate_fleet

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
              calibration: list | None) -> int:
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
            sim = simulate_fleet(workload, row["replicas"], row["policy"], cost_model, sched,
                                 cache, args.cache_load_weight, hop, calibration=calibration)
            real_p50 = row["ttft_p50"]
            error = (sim.ttft_p50 - real_p50) / real_p50 if real_p50 and sim.ttft_p50 else None
            table.add_row(str(row["replicas"]), row["policy"], f"{hop * 1e3:.0f}",
                          f"{row['prefix_hit_rate']:.3f}",
                          f"{sim.prefix_hit_rate:.3f}", _ms(real_p50), _ms(sim.ttft_p50),
                          f"{error:+.0%}" if error is not None else "-", _ms(row["ttft_p99"]),
                          _ms(sim.ttft_percentile(0.99)))
            rows_json.append({"replicas": row["replicas"], "policy": row["policy"],
                              "hop_s": hop, "real": {"hit": row["prefix_hit_rate"], "ttft_p50": real_p50,
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
            for policy in args.routing_policies.split(","):
                sim = simulate_fleet(workload, n, policy, cost_model, sched, cache,
                                     args.cache_load_weight, hop, calibration=calibration)
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


def _summary(sim: FleetResult, slo_ttft: float) -> dict:
    return {"hit": sim.prefix_hit_rate, "ttft_p50": sim.ttft_p50,
            "ttft_p99": sim.ttft_percentile(0.99), "goodput_rps": sim.goodput_rps(slo_ttft),
            "preemptions": sim.preemptions, "per_replica": sim.per_replica()}
