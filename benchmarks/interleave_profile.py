"""Where --core-split interleave's time goes in a doc-burst, in-process (issue 34).

    .venv/bin/python benchmarks/interleave_profile.py [--rounds 2] [--doc-tokens 1650]

One process, one loaded model, two engines (colocated eager, --policy adaptive), in turn per
round: 3 streams decoding, then a document. Per run: the document's TTFT; the chunks it was
prefilled in; the streams' gaps between tokens while it prefilled (engine side: taken when the
engine hands the tokens out, the interjection emit hook as the engine loop has it); the pace the
stepper used, its measured paused decode step and longest layer segment per chunk token
(core/interleave_pace.py). Default model, default flags but the policy.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time


def token_times(engine) -> dict[str, list[float]]:
    """Each request's token times (perf_counter), taken as the engine hands the tokens out
    (the interjection emit hook too, as the engine loop has it); the caller adds step()'s."""
    times: dict[str, list[float]] = {}

    def emit(outs) -> None:
        now = time.perf_counter()
        for o in outs:
            if o.new_token_ids:
                times.setdefault(o.req_id, []).append(now)

    engine.set_interjection_hooks(lambda: None, emit)
    return times


def start_streams(engine, rng, names: list[str], max_tokens: int, decoded: int) -> None:
    """The doc-burst's chat streams (30-token prompts), stepped until each decoded `decoded`."""
    from cadence.core.sampling_params import SamplingParams

    for r in names:
        engine.add_request(r, [rng.randrange(100, 40000) for _ in range(30)],
                           SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while any(engine.scheduler.get_request(r).num_output_tokens < decoded for r in names):
        engine.step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--doc-tokens", type=int, default=1650)
    args = parser.parse_args()
    from cadence.core.config import CacheConfig, SchedulerConfig
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.loader import load_model

    loaded = load_model(None)

    def make(policy: str) -> LLMEngine:
        return LLMEngine.from_loaded(loaded, EngineConfig(
            scheduler=SchedulerConfig(policy=policy),
            cache=CacheConfig(kv_cache_memory_bytes=1 << 28), startup_profile=False))

    engines = {"eager": make("eager"), "adaptive": make("adaptive")}
    rng = random.Random(0)
    for rnd in range(args.rounds):
        for mode, engine in engines.items():
            times = token_times(engine)
            streams = [f"s{rnd}{i}" for i in range(3)]
            start_streams(engine, rng, streams, 400, 5)
            chunks: list[int] = []
            execute = engine.executor.execute

            def counted(plan, between_layers=None, execute=execute, chunks=chunks):
                if plan.num_prefill_tokens:
                    chunks.append(plan.num_prefill_tokens)
                return execute(plan, between_layers)

            engine.executor.execute = counted
            doc = f"doc{rnd}"
            t0 = time.perf_counter()
            engine.add_request(doc, [rng.randrange(100, 40000) for _ in range(args.doc_tokens)],
                               SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
            ttft = None
            while ttft is None:
                outs = engine.step()
                now = time.perf_counter()
                for o in outs:
                    if o.new_token_ids:
                        times.setdefault(o.req_id, []).append(now)
                        if o.req_id == doc:
                            ttft = now - t0
            engine.executor.execute = execute
            gaps = sorted(b - a for r in streams for a, b in zip(times.get(r, []), times.get(r, [])[1:])
                          if b > t0 and a < t0 + ttft)
            sp = engine.split_stepper
            row = {"mode": mode, "round": rnd, "doc_ttft_s": round(ttft, 3), "chunks": chunks,
                   "max_gap_ms": round(1e3 * gaps[-1], 1) if gaps else None,
                   "p50_gap_ms": round(1e3 * gaps[len(gaps) // 2], 1) if gaps else None}
            if sp is not None:
                row.update(pace_ms=round(1e3 * sp.pace_s(), 1),
                           paused_decode_ms=round(1e3 * (sp._paused_decode_s or 0), 2),
                           segment_us_per_token=round(1e6 * (sp._segment_s_per_token or 0), 1))
            print(json.dumps(row), flush=True)
            for r in streams + [doc]:
                engine.abort_request(r)
            engine.step()
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
