"""Where the streams' gaps above the pace come from under --core-split interleave (issue 34).

    .venv/bin/python benchmarks/interleave_gaps.py [--servers 2] [--repeats 2] [--doc-tokens 1650]

In-process doc-burst (3 streams decoding, then a document) on fresh engines of --policy
adaptive, --repeats documents per engine (a server's first and later documents differ: the
first chunk runs before the stepper knows the model splits rows). Every executor call, pause
point (a layer boundary or a row block's), empty decode plan and loop turn is stamped; per
run the document's TTFT, its chunks and the streams' largest gap, then each gap longer than
the pace x --slack with the events between its two tokens (ms after the earlier token): what
the engine was doing when the next decode step was due (a pace after the earlier step's
start) and how late it started. Default model, default flags but the policy.
"""

from __future__ import annotations

import argparse
import json
import random
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from interleave_profile import start_streams, token_times  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--doc-tokens", type=int, default=1650)
    parser.add_argument("--slack", type=float, default=1.1)
    parser.add_argument("--top", type=int, default=4, help="the longest gaps shown")
    parser.add_argument("--events", action="store_true", help="print each long gap's events")
    args = parser.parse_args()
    from cadence.core.config import CacheConfig, SchedulerConfig
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine import split_stepper
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine
    from cadence.model.loader import load_model
    from cadence.model.pause_points import PausePoints

    events: list[tuple[float, str, str]] = []

    def stamp(kind: str, info: str = "") -> None:
        events.append((time.perf_counter(), kind, info))

    class StampedPoints(PausePoints):
        def __call__(self) -> None:
            stamp("layer", f"piece {1e3 * (time.perf_counter() - self._last):.1f}")
            super().__call__()

        def inside(self) -> None:
            now = time.perf_counter()
            due = now + (now - self._last) / 2 >= self.due_at
            stamp("block", f"piece {1e3 * (now - self._last):.1f}" + (" due" if due else ""))
            super().inside()

    split_stepper.PausePoints = StampedPoints
    loaded = load_model(None)
    rng = random.Random(0)
    for server in range(args.servers):
        engine = LLMEngine.from_loaded(loaded, EngineConfig(
            scheduler=SchedulerConfig(policy="adaptive"),
            cache=CacheConfig(kv_cache_memory_bytes=1 << 28), startup_profile=False))
        execute = engine.executor.execute

        def stamped(plan, between_layers=None, execute=execute):
            kind = "chunk" if plan.num_prefill_tokens else "decode"
            sp = engine.split_stepper
            pace = f" pace {1e3 * sp.pace_s():.1f}" if sp is not None else ""
            stamp(kind + "+", f"{plan.num_prefill_tokens}p {plan.num_decode_tokens}d{pace}")
            try:
                return execute(plan, between_layers)
            finally:
                stamp(kind + "-")

        engine.executor.execute = stamped
        sched = engine.scheduler
        schedule_decodes = sched.schedule_decodes

        def decodes(schedule_decodes=schedule_decodes, sched=sched):
            rows = sched.num_decode_rows()
            plan = schedule_decodes()
            if plan.is_empty:
                stamp("empty-plan", f"{rows} rows")
            return plan

        sched.schedule_decodes = decodes
        for rep in range(args.repeats):
            times = token_times(engine)
            streams = [f"s{server}{rep}{i}" for i in range(3)]
            start_streams(engine, rng, streams, 600, 20)
            del events[:]
            doc = f"doc{server}{rep}"
            t0 = time.perf_counter()
            engine.add_request(doc, [rng.randrange(100, 40000) for _ in range(args.doc_tokens)],
                               SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
            ttft = None
            while ttft is None or time.perf_counter() < t0 + ttft + 0.3:
                stamp("turn")
                outs = engine.step()
                now = time.perf_counter()
                for o in outs:
                    if o.new_token_ids:
                        times.setdefault(o.req_id, []).append(now)
                if ttft is None and times.get(doc):
                    ttft = times[doc][0] - t0
            sp = engine.split_stepper
            pace = sp.pace_s()
            gaps = [(b - a, r, a, b) for r in streams for a, b in zip(times[r], times[r][1:])
                    if b > t0 and a < t0 + ttft + 0.3]
            chunks = [info for _, kind, info in events if kind == "chunk+"]
            empties = sum(1 for _, kind, _ in events if kind == "empty-plan")
            blocks = [e for e in events if e[1] == "block"]
            print(json.dumps({
                "server": server, "rep": rep, "doc_ttft_s": round(ttft, 3), "chunks": chunks,
                "max_gap_ms": round(1e3 * max(gaps)[0], 1), "pace_ms": round(1e3 * pace, 1),
                "paused_step_ms": round(1e3 * (sp._paused_decode_s or 0), 2),
                "row_block": sp._block_s_per_row and round(sp._block_s_per_row * 1e6, 1),
                "rows_split": sp._rows_split, "empty_plans": empties, "block_pauses": len(blocks),
                "decode_steps": sum(1 for _, kind, _ in events if kind == "decode+"),
                "gaps_over_pace": sum(1 for g in gaps if g[0] > args.slack * pace) // 3}),
                flush=True)
            # One stream's gaps (the streams step together): the long ones with their events.
            for gap, r, a, b in sorted(g for g in gaps if g[1] == streams[0])[-args.top:]:
                inside = [e for e in events if a - 0.02 <= e[0] <= b]
                kinds = [k for _, k, _ in inside]
                print(f"  gap {1e3 * gap:.1f} ms at +{1e3 * (a - t0):.0f} ms: "
                      f"{kinds.count('layer')} layer / {kinds.count('block')} block pauses, "
                      f"{kinds.count('empty-plan')} empty plans, {kinds.count('turn')} turns, "
                      f"chunks {[i for _, k, i in inside if k == 'chunk+']}", flush=True)
                if args.events:
                    for t, kind, info in inside:
                        print(f"    {1e3 * (t - a):+8.1f} {kind} {info}")
            for r in streams + [doc]:
                engine.abort_request(r)
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
