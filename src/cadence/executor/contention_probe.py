"""Measure this machine's split-core contention (core/contention.py) on the loaded model.

Before any request: a few decode rows (their context written first) and one prompt chunk.
    decode alone   every core, the rows' next token (the colocated decode step)
    prefill alone  every core, the chunk
    beside         the chunk on a ThreadTeam of cores - 1 threads while this thread steps the
                   rows on 1 thread, as the split engine runs them
decode contention  = decode step beside / (alone x cores / 1)
prefill contention = chunk beside / (alone x cores / (cores - 1))
Medians over `rounds`, each round alone then beside, so a host's drift hits both. The chunk is
sized from the context fill's per-token time to take about CHUNK_TARGET_S, so a large model's
probe stays short. The blocks it writes are free pool blocks (nothing is cached yet); the
engine's prefix cache never saw them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from cadence.core.contention import Contention
from cadence.core.plan import ScheduledChunk, StepOutput, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.thread_team import ThreadTeam, set_thread_count, torch_threads

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
# Seconds the probe's prompt chunk should take alone on every core.
CHUNK_TARGET_S = 0.25


def _plan(chunks: list[tuple[str, int, int, tuple[int, ...]]], block_size: int) -> StepPlan:
    """(req_id, start, length, block table) -> a plan computing [start, start + length)."""
    return StepPlan(step_id=0, block_size=block_size, chunks=tuple(
        ScheduledChunk(req_id=req_id, token_ids=tuple(1 + i % 97 for i in range(length)),
                       start_pos=start, block_table=blocks, sample=True, sampling=_GREEDY,
                       output_index=0, is_prefill=length > 1)
        for req_id, start, length, blocks in chunks))


def measure_contention(execute: Callable[[StepPlan], StepOutput], block_size: int,
                       num_blocks: int, num_cores: int, rows: int = 3, context: int = 128,
                       max_chunk: int = 512, rounds: int = 3) -> Contention | None:
    """The contention of a split into 1 decode thread and num_cores - 1 prefill threads
    (None with one core or a pool too small for the probe)."""
    if num_cores < 2:
        return None
    per_row = -(-(context + 1) // block_size)
    chunk_blocks = -(-max_chunk // block_size)
    if rows * per_row + chunk_blocks > num_blocks:
        return None
    tables = [tuple(range(i * per_row, (i + 1) * per_row)) for i in range(rows)]
    base = rows * per_row
    threads_before = torch_threads()
    set_thread_count(num_cores)
    t0 = time.perf_counter()
    execute(_plan([(f"probe-d{i}", 0, context, tables[i]) for i in range(rows)], block_size))
    per_token = (time.perf_counter() - t0) / (rows * context)
    chunk = max(16, min(max_chunk, int(CHUNK_TARGET_S / max(per_token, 1e-9))))
    decode = _plan([(f"probe-d{i}", context, 1, tables[i]) for i in range(rows)], block_size)
    prefill = _plan([("probe-p", 0, chunk, tuple(range(base, base + -(-chunk // block_size))))],
                    block_size)
    team = ThreadTeam("contention-probe", num_cores - 1)
    samples = []
    try:
        team.submit(lambda: execute(prefill)).result()  # warm the team's threads
        for _ in range(rounds):
            set_thread_count(num_cores)
            decode_alone = _median_time(lambda: execute(decode), 8)
            prefill_alone = _median_time(lambda: execute(prefill), 1)
            set_thread_count(1)
            t_start = time.perf_counter()
            future = team.submit(lambda: execute(prefill))
            beside = []
            while not future.done():
                t1 = time.perf_counter()
                execute(decode)
                beside.append(time.perf_counter() - t1)
            future.result()
            prefill_beside = time.perf_counter() - t_start
            if beside:
                samples.append((statistics.median(beside) / (decode_alone * num_cores),
                                prefill_beside / (prefill_alone * num_cores / (num_cores - 1))))
    finally:
        team.close()
        set_thread_count(threads_before)
    if not samples:
        return None
    return Contention(decode=statistics.median(s[0] for s in samples),
                      prefill=statistics.median(s[1] for s in samples), num_cores=num_cores,
                      decode_threads=1, prefill_threads=num_cores - 1, measured_at=time.time())


def _median_time(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
