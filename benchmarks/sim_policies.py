"""Batching policies in the simulator: eager vs chunked (several budgets) vs slo (several ITL
targets) on the doc-burst workload, for each hardware profile; optionally checked against the
real engine.

Simulated: the real cadence.core scheduler on a virtual clock, step time from a roofline of
SmolLM2-135M in bf16 (cadence.sim.cost_model). Deterministic: same arguments, same tables.

`--real` also runs the real engine (default model, CPU) on a smaller doc-burst with a trace
file, fits a step-cost profile to that trace, and prints the measured rows next to the
simulated ones (roofline and fitted), so the simulator's error is visible. Run:

    .venv/bin/python benchmarks/sim_policies.py                  # simulation only, seconds
    .venv/bin/python benchmarks/sim_policies.py --real           # + real engine, minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from cadence.core.config import SchedulerConfig
from cadence.sim.compare import policy_variants, run_comparison
from cadence.sim.cost_model import RooflineCostModel
from cadence.sim.hardware import PROFILES, get_profile
from cadence.sim.metrics import SimSummary, describe, summarize
from cadence.sim.model_shape import SMOLLM2_135M
from cadence.sim.report import comparison_table, summaries_as_dicts
from cadence.sim.simulator import SimResult, SimStep, default_cache
from cadence.sim.trace_fit import fit_trace
from cadence.sim.workload import Workload, doc_burst, prompt_token_ids


def run_real(workload: Workload, configs: list[SchedulerConfig], trace_dir: Path, dtype: str):
    """Each config on the real engine; returns (summaries, trace paths). Requests are added
    when the engine clock passes their arrival time, as the simulator does."""
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.loader import load_model

    loaded = load_model(None, dtype=dtype, device="cpu")
    summaries, traces = [], []
    for i, sched in enumerate(configs):
        trace = trace_dir / f"real-{i}-{sched.policy}.jsonl"
        cache = default_cache(workload)
        engine = LLMEngine.from_loaded(
            loaded, EngineConfig(scheduler=sched, cache=cache, trace_path=str(trace))
        )
        pending = sorted(workload.requests, key=lambda r: r.arrival_s)
        t0 = time.monotonic()
        while pending or engine.has_unfinished():
            now = time.monotonic() - t0
            while pending and pending[0].arrival_s <= now:
                spec = pending.pop(0)
                params = SamplingParams(
                    max_tokens=spec.output_tokens, temperature=0.0, ignore_eos=True
                )
                ids = prompt_token_ids(spec, loaded.tokenizer.vocab_size, workload.seed)
                engine.add_request(spec.req_id, ids, params, arrival_time=t0 + spec.arrival_s)
            if engine.has_unfinished():
                engine.step()
            elif pending:
                time.sleep(max(0.0, pending[0].arrival_s - (time.monotonic() - t0)))
        engine.close()
        timelines = {t.req_id: t for t in engine.telemetry.finished_timelines()}
        steps = [SimStep.from_record(r) for r in engine.telemetry.steps]
        result = SimResult(workload, sched, cache, "real engine", timelines, steps)
        summaries.append(dataclasses.replace(summarize(result), label="REAL " + describe(result)))
        traces.append(trace)
    return summaries, traces


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated profiles")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real", action="store_true", help="also run the real engine (CPU)")
    p.add_argument("--real-dtype", default="bfloat16")
    p.add_argument("--json", default=None, help="write every table's rows here")
    args = p.parse_args(argv)
    console = Console(width=160)
    everything: dict[str, list[dict]] = {}

    workload = doc_burst(num_streams=args.streams, doc_prompt_tokens=args.doc_tokens,
                         seed=args.seed)
    configs = policy_variants()
    for name in args.profiles.split(","):
        cost = RooflineCostModel(SMOLLM2_135M, get_profile(name.strip()))
        t0 = time.perf_counter()
        rows = run_comparison(workload, cost, configs)
        title = (f"doc-burst: {args.streams} streams, {args.doc_tokens}-token document at 1 s; "
                 f"{cost.name}; simulated in {time.perf_counter() - t0:.1f} s")
        console.print(comparison_table(rows, title))
        everything[title] = summaries_as_dicts(rows)

    if args.real:
        # Smaller, so each real run takes seconds to a minute on two cores.
        small = doc_burst(num_streams=3, stream_prompt_tokens=128, stream_output_tokens=120,
                          doc_prompt_tokens=1536, doc_output_tokens=8, doc_arrival_s=0.5,
                          seed=args.seed)
        real_configs = [
            SchedulerConfig(policy="eager", max_num_batched_tokens=512),
            SchedulerConfig(policy="chunked", max_num_batched_tokens=256),
            # 100 ms is below one block + 3 decodes on a loaded 2-core machine: ask for 200.
            SchedulerConfig(policy="slo", max_num_batched_tokens=2048, target_itl_ms=200.0),
        ]
        with tempfile.TemporaryDirectory() as tmp:
            real_rows, traces = run_real(small, real_configs, Path(tmp), args.real_dtype)
            fitted = fit_trace(traces[1])  # the chunked run mixes prefill and decode steps
        console.print(f"fitted from the real chunked run's trace: {fitted.coefficients}")
        rows_fitted = run_comparison(workload, fitted, configs)
        title = (f"doc-burst: {args.streams} streams, {args.doc_tokens}-token document at 1 s; "
                 f"step cost {fitted.name} (this machine, real engine)")
        console.print(comparison_table(rows_fitted, title))
        everything[title] = summaries_as_dicts(rows_fitted)
        roofline = RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core"))
        rows: list[SimSummary] = []
        for cost, tag in ((roofline, "SIM roofline "), (fitted, "SIM fitted ")):
            for s in run_comparison(small, cost, real_configs):
                rows.append(dataclasses.replace(s, label=tag + s.label))
        rows = [r for triple in zip(real_rows, rows[:3], rows[3:]) for r in triple]
        title = "real engine vs simulator: 3 streams, 1536-token document at 0.5 s (CPU)"
        console.print(comparison_table(rows, title))
        everything[title] = summaries_as_dicts(rows)

    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
