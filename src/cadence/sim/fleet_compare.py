"""`cadence sim --compare RESULTS.json [RESULTS.json ...]`: measured benchmarks/replica_bench.py
runs replayed in the fleet simulator (sim/fleet.py), each with what it measured about its host
(fleet_cli.run_host) and the machine profile it is priced by, next to what was measured.

Why several runs: near saturation (the 2-replica RAG chat of docs/performance.md, whose
round-robin p99 is 6-16 s) one run's TTFT p50 is one draw of a chaotic closed loop: the same
command measured round-robin p50 831 / 1035 / 1593 ms in three slots, because its TTFT
distribution is steep at the median (p45 to p55 moved 1.1 -> 1.9 s). So each run is simulated
from its own records and traces, and the check is the median of the measured p50s against the
median of the simulated ones, over the same runs (each run's simulation is the median run over
seeds of the profile's step-time spread, as for one run). The measured TTFTs are never an input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import statistics
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.step_profile import plans_of_rows
from cadence.sim.conversations import from_replica_bench
from cadence.sim.cost_model import CostModel
from cadence.sim.fleet import FleetResult, simulate_fleet
from cadence.sim.host_cpu import HostCpu, host_from_run
from cadence.sim.run_speed import PacedCostModel, measure_run_speed
from cadence.sim.step_jitter import StepJitter


# Blocks per replica when nothing says (the engines' default pool holds far more than these
# workloads: no eviction).
UNBOUNDED_KV_BLOCKS = 1 << 16
DEFAULT_HOP_MS = 15.0


@dataclass(frozen=True)
class RunProfile:
    """The machine profile a measured run is priced by: its cost model, the samples that seed
    the schedulers' step-cost model and the profile's rounds (step-time spread)."""

    cost_model: CostModel
    calibration: list | None = None
    rounds: list | None = None


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.0f}" if value is not None else "-"


def compare_runs(paths: list[str], profiles: list[RunProfile], args,
                 console: Console) -> list[dict]:
    """Every row of every run at `paths` (one profile each) replayed and printed; with two or
    more runs also the median table (medians_over_runs). Returns the JSON rows: each run's,
    then the medians' (`"run": "median"`)."""
    sched = SchedulerConfig()
    rows_json: list[dict] = []
    for index, (path, profile) in enumerate(zip(paths, profiles)):
        with open(path, encoding="utf-8") as f:
            measured = json.load(f)
        blocks = args.kv_blocks or kv_blocks_of(measured["args"]) or UNBOUNDED_KV_BLOCKS
        cache = CacheConfig(block_size=16, num_blocks=blocks)
        table = Table(title=f"simulator vs measured ({path}; {profile.cost_model.name}; "
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
            host, row_cost = None, profile.cost_model
            if args.host_cpu:
                host, row_cost = run_host(row, profile.cost_model)
                if host is not None:
                    console.print(f"{row['replicas']} x {row['policy']}: {row_cost.name}; "
                                  f"{host.describe()}")
            # Each replica's scheduler plans chunks from its engine's startup profile where the
            # run recorded it, else from the pricing profile.
            engines = engine_calibrations(row, cache.block_size)
            sim: FleetResult = median_run([
                simulate_fleet(workload, row["replicas"], row["policy"], row_cost, sched, cache,
                               args.cache_load_weight, hop, calibration=profile.calibration,
                               host=host, jitter=j, replica_calibrations=engines)
                for j in jitters(profile.rounds, getattr(args, "sim_seeds", 0))])
            real_p50 = row["ttft_p50"]
            error = _error(sim.ttft_p50, real_p50)
            table.add_row(str(row["replicas"]), row["policy"], f"{hop * 1e3:.0f}",
                          f"{row['prefix_hit_rate']:.3f}",
                          f"{sim.prefix_hit_rate:.3f}", _ms(real_p50), _ms(sim.ttft_p50),
                          f"{error:+.0%}" if error is not None else "-", _ms(row["ttft_p99"]),
                          _ms(sim.ttft_percentile(0.99)))
            rows_json.append({"run": index, "results": path, "replicas": row["replicas"],
                              "policy": row["policy"], "hop_s": hop,
                              "host": host.describe() if host else None,
                              "real": {"hit": row["prefix_hit_rate"], "ttft_p50": real_p50,
                                       "ttft_p99": row["ttft_p99"]},
                              "sim": summary(sim, args.slo_ttft), "ttft_p50_error": error})
        console.print(table)
    if len(paths) > 1:
        medians = medians_over_runs(rows_json)
        table = Table(title=f"median over {len(paths)} runs: measured TTFT p50 (each run's) "
                            "against simulated (each run's replay)")
        for col in ("replicas", "policy", "hit real", "hit sim", "TTFT p50 real (runs)",
                    "median", "sim (runs)", "median", "error"):
            table.add_column(col, justify="right")
        for m in medians:
            table.add_row(str(m["replicas"]), m["policy"], f"{m['real']['hit']:.3f}",
                          f"{m['sim']['hit']:.3f}",
                          " / ".join(_ms(v) for v in m["real"]["ttft_p50_runs"]),
                          _ms(m["real"]["ttft_p50"]),
                          " / ".join(_ms(v) for v in m["sim"]["ttft_p50_runs"]),
                          _ms(m["sim"]["ttft_p50"]),
                          f"{m['ttft_p50_error']:+.0%}" if m["ttft_p50_error"] is not None
                          else "-")
        console.print(table)
        rows_json.extend(medians)
    return rows_json


def medians_over_runs(rows: list[dict]) -> list[dict]:
    """Per (replicas, policy), over the runs' rows (compare_runs' JSON rows): the measured
    and the simulated TTFT p50 of each run, their medians and the medians' error, and the
    median hit rates; in the order the rows first name each pair."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        if row.get("run") != "median":
            groups.setdefault((row["replicas"], row["policy"]), []).append(row)
    out = []
    for (replicas, policy), group in groups.items():
        real = [r["real"]["ttft_p50"] for r in group if r["real"]["ttft_p50"] is not None]
        sim = [r["sim"]["ttft_p50"] for r in group if r["sim"]["ttft_p50"] is not None]
        real_p50 = statistics.median(real) if real else None
        sim_p50 = statistics.median(sim) if sim else None
        out.append({"run": "median", "runs": len(group), "replicas": replicas,
                    "policy": policy,
                    "real": {"hit": statistics.median(r["real"]["hit"] for r in group),
                             "ttft_p50": real_p50, "ttft_p50_runs": real},
                    "sim": {"hit": statistics.median(r["sim"]["hit"] for r in group),
                            "ttft_p50": sim_p50, "ttft_p50_runs": sim},
                    "ttft_p50_error": _error(sim_p50, real_p50)})
    return out


def _error(sim: float | None, real: float | None) -> float | None:
    return (sim - real) / real if real and sim else None


def kv_blocks_of(args_of_run: dict) -> int | None:
    words = shlex.split(args_of_run.get("serve_args") or "")
    if "--num-kv-blocks" in words:
        return int(words[words.index("--num-kv-blocks") + 1])
    return None


def engine_calibrations(row: dict, block_size: int) -> list[list | None] | None:
    """Each replica's startup profile as (plan, seconds) samples, from a replica_bench.py row
    (`engine_profiles`: the engines' trace meta lines); None for a replica without one, and
    None for a row without any (runs before the engines recorded them).

    Why: an engine's slo policy plans a prompt's chunks from its own startup profile (the
    prior of its step-cost model), timed at its start beside the other replica's; the pricing
    profile (cal.json) is another moment's, and a plan made from it cut the ~180 uncached
    tokens of a mostly cached turn into 3 chunks where the engine ran them whole."""
    rows = row.get("engine_profiles")
    if not rows:
        return None
    engines = [plans_of_rows(r, block_size) or None if r else None for r in rows]
    return engines if any(engines) else None


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
        cost_model = PacedCostModel(cost_model, speed.alone if speed else 1.0, overhead,
                                    speed.prompt_pace if speed else None)
    if host is not None and speed is not None and (
            row["replicas"] * host.threads_per_replica <= host.cores):
        host = dataclasses.replace(host, corun_slowdown=speed.corun_slowdown(host))
    return host, cost_model


def summary(sim: FleetResult, slo_ttft: float) -> dict:
    return {"hit": sim.prefix_hit_rate, "ttft_p50": sim.ttft_p50,
            "ttft_p99": sim.ttft_percentile(0.99), "goodput_rps": sim.goodput_rps(slo_ttft),
            "preemptions": sim.preemptions, "per_replica": sim.per_replica()}
