"""Timing helpers shared by the benchmark scripts (imported as `_common`: each script runs as
`python benchmarks/X.py`, which puts this folder on sys.path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def run_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of each of `repeats` runs of fn(), after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall seconds of fn() over `repeats` runs after `warmup` runs."""
    return statistics.median(run_times(fn, repeats, warmup))
