"""How much a decode step slows down when a prefill chunk computes beside it on the other cores
(and the chunk beside decode steps): the memory-bandwidth contention of --core-split.

    .venv/bin/python benchmarks/core_split_contention.py [--rows 3] [--chunk 512] [--rounds 5]

Offline on the default model: the decode team (this thread) and the prefill team (a ThreadTeam)
get one thread each (cores // 2 with more cores). Per round, in the same run: decode steps of
--rows rows alone, then beside a stream of --chunk-token prefill chunks; prefill chunks alone,
then beside a stream of decode steps. Prints medians and the ratios (same threads alone vs
beside; the engine's startup probe, executor/contention_probe.py, measures the factor the
simulator and CoreSplit use, against the colocated step's core share, and caches it per
machine). The load average is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.model_runner import ModelExecutor
from cadence.executor.thread_team import ThreadTeam, set_thread_count
from cadence.model.loader import load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


def plan_of(chunks: list[tuple[str, int, int, list[int]]], block_size: int) -> StepPlan:
    """(req_id, start, length, blocks) -> a plan computing [start, start + length) of each."""
    out = []
    for req_id, start, length, blocks in chunks:
        out.append(ScheduledChunk(req_id=req_id, token_ids=tuple(range(100, 100 + length)),
                                  start_pos=start, block_table=tuple(blocks), sample=True,
                                  sampling=GREEDY, output_index=0, is_prefill=length > 1))
    return StepPlan(step_id=0, chunks=tuple(out), block_size=block_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--context", type=int, default=256, help="decode rows' context")
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    loaded = load_model(None)
    block = 16
    ex = ModelExecutor(loaded, num_blocks=512, block_size=block)
    cores = os.cpu_count() or 2
    decode_threads = max(1, cores // 2)
    prefill_threads = max(1, cores - decode_threads)
    blocks_per = (args.context + block) // block
    decode_plan = plan_of([(f"d{i}", args.context, 1, list(range(i * blocks_per, (i + 1) * blocks_per)))
                           for i in range(args.rows)], block)
    base = args.rows * blocks_per
    prefill_plan = plan_of([("p", 0, args.chunk, list(range(base, base + args.chunk // block + 1)))], block)
    # Warm both paths (and fill the decode rows' context blocks).
    for i in range(args.rows):
        ex.execute(plan_of([(f"d{i}", 0, args.context, list(range(i * blocks_per, (i + 1) * blocks_per)))], block))
    team = ThreadTeam("prefill", prefill_threads)
    team.submit(lambda: ex.execute(prefill_plan)).result()
    set_thread_count(decode_threads)
    ex.execute(decode_plan)

    def decode_alone(n: int = 20) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            ex.execute(decode_plan)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def prefill_alone() -> float:
        t0 = time.perf_counter()
        team.submit(lambda: ex.execute(prefill_plan)).result()
        return time.perf_counter() - t0

    def decode_beside() -> tuple[float, float]:
        t0 = time.perf_counter()
        fut = team.submit(lambda: ex.execute(prefill_plan))
        times = []
        while not fut.done():
            t1 = time.perf_counter()
            ex.execute(decode_plan)
            times.append(time.perf_counter() - t1)
        fut.result()
        return statistics.median(times), time.perf_counter() - t0

    rows = []
    for r in range(args.rounds):
        d_alone = decode_alone()
        p_alone = prefill_alone()
        d_beside, p_beside = decode_beside()
        rows.append((d_alone, d_beside, p_alone, p_beside))
        print(f"round {r}: decode {d_alone * 1e3:.1f} -> {d_beside * 1e3:.1f} ms beside a prefill; "
              f"prefill {p_alone * 1e3:.0f} -> {p_beside * 1e3:.0f} ms beside decodes", flush=True)
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"threads decode {decode_threads} / prefill {prefill_threads}; rows {args.rows}, "
          f"context {args.context}, chunk {args.chunk}; load {os.getloadavg()}")
    print(f"median decode step {med[0] * 1e3:.1f} ms alone, {med[1] * 1e3:.1f} ms beside a "
          f"prefill: x{med[1] / med[0]:.2f}")
    print(f"median prefill chunk {med[2] * 1e3:.0f} ms alone, {med[3] * 1e3:.0f} ms beside "
          f"decodes: x{med[3] / med[2]:.2f}")
    team.close()


if __name__ == "__main__":
    main()
