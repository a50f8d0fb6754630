"""A decode step paused inside an interleaved prompt chunk against the same batch's step alone,
split by phase (issue 34: --core-split interleave's pace is 11x the paused step).

    .venv/bin/python benchmarks/paused_step_profile.py [--rounds 3] [--ctx 300] [--rerun]

One process, one loaded model, one engine (--policy adaptive, interleave). Per round: 3 streams
decode to --ctx tokens of context; --alone steps of theirs run alone (timed from the engine's
step); then a --doc-tokens document prefills and the decode steps paused between its layers are
timed; then --alone steps alone again. Per step: the pause's pieces (schedule, the executor's
call, the outputs: scheduler update, detokenizing, telemetry; the stats the server's emit hook
adds: LLMEngineAdapter.stats) and the fused stack's thread-0 phases. --rerun runs each paused
step's plan a second time right after (the same rows and KV slots: the same values rewritten),
a step with warm caches, for diagnosis only. Medians per round; one JSON line each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time

PHASES = ("qkv", "rope", "attention", "o", "norm", "gate_up", "down", "norm2", "head")


def _median_ms(rows: list[dict], key: str) -> float:
    return round(1e3 * statistics.median(r[key] for r in rows), 3) if rows else float("nan")


def _summary(rows: list[dict]) -> dict:
    out = {"n": len(rows)}
    for key in rows[0] if rows else ():
        if key != "phases":
            out[key + "_ms"] = _median_ms(rows, key)
    if rows and rows[0].get("phases"):
        out["phases_ms"] = {name: round(1e3 * statistics.median(r["phases"][i] for r in rows), 3)
                            for i, name in enumerate(PHASES[:len(rows[0]["phases"])])}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=300, help="the streams' context when measured")
    parser.add_argument("--alone", type=int, default=24, help="decode steps alone per round")
    parser.add_argument("--doc-tokens", type=int, default=1650)
    parser.add_argument("--rerun", action="store_true", help="run each paused plan twice")
    args = parser.parse_args()
    from cadence.core.config import CacheConfig, SchedulerConfig
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.loader import load_model

    loaded = load_model(None)
    engine = LLMEngine.from_loaded(loaded, EngineConfig(
        scheduler=SchedulerConfig(policy="adaptive"),
        cache=CacheConfig(kv_cache_memory_bytes=1 << 29), startup_profile=False))
    executor, sched = engine.executor, engine.scheduler
    model = executor.model
    execute = executor.execute
    state: dict = {"rows": None, "in_chunk": False}

    def stack_phases() -> list[float]:
        stack = getattr(model, "_decode_stack", None)
        return list(stack.phase_seconds()) if stack else []

    def timed_execute(plan, between_layers=None):
        if between_layers is None:
            t0 = time.perf_counter()
            out = execute(plan)
            row = {"execute": time.perf_counter() - t0, "phases": stack_phases()}
            if state["in_chunk"] and args.rerun and plan.num_prefill_tokens == 0:
                t1 = time.perf_counter()
                execute(plan)
                row["rerun"] = time.perf_counter() - t1
                row["rerun_phases"] = stack_phases()
            state["last"] = row
            return out
        seg = {"end": None}

        def hook():
            t0 = time.perf_counter()
            state["last"] = None
            between_layers()
            row = state["last"]
            if row is not None and state["rows"] is not None:
                row["pause"] = time.perf_counter() - t0
                # What the server's emit hook adds per paused step besides sending: the scheduler's stats.
                t1 = time.perf_counter()
                dataclasses.asdict(sched.stats())
                row["stats"] = time.perf_counter() - t1
                state["rows"].append(row)
        state["in_chunk"] = True
        try:
            return execute(plan, between_layers=hook)
        finally:
            state["in_chunk"] = False

    executor.execute = timed_execute
    schedule_decodes, finish = sched.schedule_decodes, engine._finish_step

    def timed_schedule():
        t0 = time.perf_counter()
        plan = schedule_decodes()
        state["schedule"] = time.perf_counter() - t0
        return plan

    def timed_finish(plan, out, t_start):
        t0 = time.perf_counter()
        outs = finish(plan, out, t_start)
        if state.get("last") is not None and plan.num_decode_tokens and not plan.num_prefill_tokens:
            state["last"]["finish"] = time.perf_counter() - t0
            state["last"]["schedule"] = state.get("schedule", 0.0)
        return outs

    sched.schedule_decodes = timed_schedule
    engine._finish_step = timed_finish
    engine.set_interjection_hooks(lambda: None, lambda outs: None)
    def alone_steps(n: int) -> list[dict]:
        rows = []
        for _ in range(n):
            state["last"] = None
            t0 = time.perf_counter()
            engine.step()
            row = state["last"]
            if row is not None:
                rows.append({"step": time.perf_counter() - t0, **row})
        return rows

    rng = random.Random(0)
    for rnd in range(args.rounds):
        streams = [f"s{rnd}{i}" for i in range(3)]
        for r in streams:
            engine.add_request(r, [rng.randrange(100, 40000) for _ in range(30)],
                               SamplingParams(temperature=0.0, max_tokens=args.ctx + 400,
                                              ignore_eos=True))
        while any(sched.get_request(r).num_output_tokens < args.ctx - 30 for r in streams):
            engine.step()
        before = alone_steps(args.alone)
        paused: list[dict] = []
        state["rows"] = paused
        doc = f"doc{rnd}"
        engine.add_request(doc, [rng.randrange(100, 40000) for _ in range(args.doc_tokens)],
                           SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        t0 = time.perf_counter()
        first = None
        while first is None:
            for o in engine.step():
                if o.req_id == doc and (o.new_token_ids or o.finished):
                    first = o
        if first.finished and not first.new_token_ids:
            print("doc", doc, "ended without a token:", first, file=sys.stderr)
        ttft = time.perf_counter() - t0
        state["rows"] = None
        engine.abort_request(doc)
        after = alone_steps(args.alone)
        report = {"round": rnd, "ctx": args.ctx, "doc_ttft_s": round(ttft, 3),
                  "alone_before": _summary(before), "alone_after": _summary(after),
                  "paused": _summary([{k: v for k, v in r.items() if k != "rerun_phases"}
                                      for r in paused])}
        if args.rerun and paused:
            report["rerun_phases_ms"] = _summary(
                [{"phases": r["rerun_phases"], "rerun": r["rerun"]} for r in paused])
        sp = engine.split_stepper
        if sp is not None:
            report["pace_ms"] = round(1e3 * sp.pace_s(), 1)
        print(json.dumps(report), flush=True)
        for r in streams + [doc]:
            engine.abort_request(r)
        engine.step()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
