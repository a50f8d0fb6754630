"""ThreadTeam: one Python thread that runs forwards on its own set of cores.

The split engine (engine/split_stepper.py) runs prefill chunks on a ThreadTeam while the loop
thread runs decode steps: two forwards at once over the same weights and KV pool (disjoint
blocks). That works because torch ops and every cadence kernel release the GIL while they
compute, and because the number of threads a parallel region uses is per calling thread
(OpenMP's nthreads ICV, which at::get_num_threads reads and torch.set_num_threads sets for the
calling thread): each team sizes its own regions. The team's thread may also be pinned to its
cores (sched_setaffinity on the thread id; CADENCE_PIN_TEAMS=1), so that its OpenMP workers,
created by it and inheriting its mask, never run on the other team's cores; idle OpenMP workers sleep
(OMP_WAIT_POLICY=PASSIVE, set by cadence at import), and the fused stacks' barrier yields.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def set_thread_count(num_threads: int) -> None:
    """Size the calling thread's parallel regions. A thread's first parallel op initialises
    its count from the process-wide value, so that happens first (else it would undo this)."""
    torch.get_num_threads()  # lazy per-thread init
    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


def torch_threads() -> int:
    """The calling thread's parallel-region size."""
    return torch.get_num_threads()


def pin_thread(cores: Iterable[int] | None) -> None:
    """Pin the calling thread (and the OpenMP workers it creates from now on) to `cores`;
    None leaves it where it is."""
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(threading.get_native_id(), set(cores))


class ThreadTeam:
    """A worker thread that runs submitted callables one at a time with `num_threads` threads
    per parallel region (pinned to `cores` when given)."""

    def __init__(self, name: str, num_threads: int, cores: Iterable[int] | None = None) -> None:
        self.name = name
        self._num_threads = num_threads
        self._cores = tuple(cores) if cores is not None else None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"cadence-{name}", daemon=True)
        self._thread.start()

    @property
    def num_threads(self) -> int:
        return self._num_threads

    def resize(self, num_threads: int, cores: Iterable[int] | None = None) -> None:
        """Applied from the next job on (the team's thread sets it itself)."""
        self._num_threads = num_threads
        self._cores = tuple(cores) if cores is not None else None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        applied: tuple[int, tuple[int, ...] | None] | None = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                wanted = (self._num_threads, self._cores)
                if wanted != applied:
                    pin_thread(self._cores)
                    set_thread_count(self._num_threads)
                    applied = wanted
                result = fn()
            except BaseException as exc:  # handed to the caller, who decides
                future.set_exception(exc)
            else:
                future.set_result(result)
