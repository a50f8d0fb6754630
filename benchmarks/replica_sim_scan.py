"""Where does cache-aware routing's prefix hit rate reach 2x round-robin's? Workload points of
the fleet simulator (sim/fleet.py), each over several workload seeds, priced as a measured run
was: its profile and what it measured about its host (sim/fleet_compare.run_host).

    .venv/bin/python benchmarks/replica_sim_scan.py --run /tmp/replicas \\
        --point 16:0.5:2:384 --point 20:0.6:2:384 --point 16:0.5:2:65536 --seeds 8

--run is a benchmarks/replica_bench.py --out folder with its profile (`cal.json`, from
`cadence sim --calibrate --threads 1 --calibrate-rounds 3 --save-calibration RUN/cal.json`);
each --point is CONVERSATIONS:RATE:THINK_S:KV_BLOCKS (per replica)[:THINK_DIST] on the
synthetic conversations of sim/conversations.py (4-8 turns, Poisson starts, think times
drawn from THINK_DIST, default --think-dist: exponential, constant or uniform;
sim/think_time.py),
whose per-turn tokens (--turn-tokens: the retrieved passage and the question, with the chat
template's markers), answers and system prompts default to the RAG chat of
docs/performance.md#replicas-and-routing. Printed per point: cache-aware / round-robin hit
ratio (min and median over seeds, in how many seeds it is >= --bar, and what routing alone
gives: routing_only_ratio), each policy's median hit and TTFT p50, how many seeds have cache-aware's
p50 below round-robin's, p99s, the share of prompt tokens cached when routed but evicted
before admission (lost_before_admission: a queued request's prefix taken by the running ones'
allocations), the most preemptions and the longest run (the benchmark runs the three policies one after another,
so these bound its time). A scan takes 2-6 s of CPU per point and seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.calibration import cost_model_from_samples, load_profile
from cadence.sim.conversations import ConversationWorkload, synthetic
from cadence.sim.fleet import simulate_fleet
from cadence.sim.fleet_compare import run_host
from cadence.sim.think_time import add_think_arguments

POLICIES = ("round-robin", "least-loaded", "cache-aware")


def routing_only_ratio(workload: ConversationWorkload, block_size: int = 16) -> float:
    """Cache-aware / round-robin hit ratio with 2 replicas when routing is all that differs:
    cache-aware finds every later turn's whole history cached (up to its last full block);
    round-robin sends a turn to its previous turn's replica half the time (the same hit) and
    otherwise finds only the shared system prompt's full blocks, the other replica's older
    prefix evicted. First turns hit the system prompt under both. Eviction of newer prefixes
    (load: queues, preemption) is what can take round-robin below this."""
    cache_aware = round_robin = 0.0
    for conv in workload.conversations:
        system = workload.system_tokens[conv.system] // block_size * block_size
        history = workload.system_tokens[conv.system]
        for k, turn in enumerate(conv.turns):
            whole = history // block_size * block_size if k else system
            cache_aware += whole
            round_robin += (whole + system) / 2 if k else system
            history += turn.new_tokens + turn.output_tokens
    return cache_aware / round_robin if round_robin else float("inf")


def lost_before_admission(sim) -> float:
    """Prompt tokens the replica held cached when the request was routed to it but no longer
    when it was admitted, over all prompt tokens."""
    lost = sum(max(0, r.expected_cached_tokens - r.cached_tokens) for r in sim.requests)
    return lost / max(1, sum(r.prompt_tokens for r in sim.requests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True,
                        help="a replica_bench.py --out folder with results.json and cal.json")
    parser.add_argument("--point", action="append", required=True,
                        metavar="CONVERSATIONS:RATE:THINK_S:KV_BLOCKS[:THINK_DIST]")
    add_think_arguments(parser, mean_flag="THINK_S")  # --think-dist: points that name none
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=8, help="workload seeds per point")
    parser.add_argument("--turn-tokens", type=int, default=178,
                        help="new prompt tokens per turn besides the previous answer")
    parser.add_argument("--answer-tokens", type=int, default=48)
    parser.add_argument("--system-tokens", type=int, default=45)
    parser.add_argument("--systems", type=int, default=3)
    parser.add_argument("--bar", type=float, default=2.0,
                        help="count the seeds whose ratio is at least this")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated; screening needs only cache-aware,round-robin"
                             " (least-loaded's columns then print '-')")
    args = parser.parse_args()
    policies = [p for p in POLICIES if p in args.policies.split(",")]
    if not {"cache-aware", "round-robin"} <= set(policies):
        parser.error("--policies needs cache-aware and round-robin (the ratio)")

    with open(os.path.join(args.run, "results.json"), encoding="utf-8") as f:
        rows = {r["policy"]: r for r in json.load(f)["results"] if r["replicas"] == 2}
    samples = load_profile(os.path.join(args.run, "cal.json"))
    cost = cost_model_from_samples(samples)
    # The measured run's host terms per policy (its stack's CPU, pace, co-run factor, hop).
    hosts = {p: run_host(row, cost) for p, row in rows.items()}
    print(f"priced by {args.run} (its profile and host terms); {args.seeds} workload seeds")
    for point in args.point:
        conversations, rate, think, blocks, *dist = point.split(":")
        think_dist = dist[0] if dist else args.think_dist
        cache = CacheConfig(block_size=16, num_blocks=int(blocks))
        runs: dict[str, list] = {p: [] for p in policies}
        bounds = []
        for seed in range(args.seeds):
            workload = synthetic(int(conversations), float(rate), args.systems,
                                 args.system_tokens, 0, args.turn_tokens, args.answer_tokens,
                                 think_mean_s=float(think), seed=seed,
                                 think_dist=think_dist, think_spread=args.think_spread)
            bounds.append(routing_only_ratio(workload))
            for policy in policies:
                host, row_cost = hosts[policy]
                runs[policy].append(simulate_fleet(
                    workload, args.replicas, policy, row_cost, SchedulerConfig(), cache,
                    hop_s=rows[policy]["hop_s"], calibration=samples, host=host))
        ca, rr, ll = runs["cache-aware"], runs["round-robin"], runs.get("least-loaded")
        ratios = sorted(c.prefix_hit_rate / r.prefix_hit_rate for c, r in zip(ca, rr))

        def med(sims, attr, fmt="{:.2f}", scale=1.0):
            if not sims:  # a policy left out of the scan
                return "-"
            return fmt.format(scale * statistics.median(getattr(s, attr) for s in sims))

        def p50_ms(sims):
            return med(sims, "ttft_p50", "{:.0f}", 1e3)

        wall = {p: (f"{max(max(r.finished_s or 0.0 for r in s.requests) for s in runs[p]):.0f}"
                    if runs.get(p) else "-") for p in POLICIES}
        print(f"{point:>18}  ratio min {ratios[0]:.2f} median {statistics.median(ratios):.2f}"
              f" (>= {args.bar:g} in {sum(r >= args.bar for r in ratios)}/{args.seeds};"
              f" routing alone {statistics.median(bounds):.2f})"
              f" | hit ca {med(ca, 'prefix_hit_rate')} ll {med(ll, 'prefix_hit_rate')}"
              f" rr {med(rr, 'prefix_hit_rate')} | TTFT p50 ca {p50_ms(ca)} ll {p50_ms(ll)}"
              f" rr {p50_ms(rr)} ms (ca < rr in "
              f"{sum(c.ttft_p50 < r.ttft_p50 for c, r in zip(ca, rr))}/{args.seeds})"
              f" | p99 ca {statistics.median(s.ttft_percentile(0.99) for s in ca):.1f}"
              f" rr {statistics.median(s.ttft_percentile(0.99) for s in rr):.1f} s"
              f" | lost before admission ca"
              f" {statistics.median(lost_before_admission(s) for s in ca):.3f}"
              f" rr {statistics.median(lost_before_admission(s) for s in rr):.3f}"
              f" | preemptions max ca {max(s.preemptions for s in ca)}"
              f" rr {max(s.preemptions for s in rr)}"
              f" | longest run ca {wall['cache-aware']} ll {wall['least-loaded']}"
              f" rr {wall['round-robin']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
