"""Progress lines for the slow parts of a first start, so a user does not stare at a silent
terminal: the CPU kernels' compile (1-2 minutes on the first run of a version, cached after)
and the startup profile (10-30 s of timed steps, sized by the model, that calibrate the scheduler)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("cadence.engine")

# A phase shorter than this says nothing when it ends (the usual, cached case).
_QUIET_S = 3.0


def say(message: str) -> None:
    """One line on stderr: through cadence's logger where the server configured one, directly
    otherwise (offline LLM() scripts configure no logging)."""
    if logging.getLogger("cadence").handlers or logging.getLogger().handlers:
        logger.info(message)
    else:
        print(f"INFO cadence: {message}", file=sys.stderr)


@contextmanager
def phase(start: str, done: str, announce: bool = True) -> Iterator[None]:
    """Say `start` (when announce), run the block, then `done` with its seconds if slow."""
    if announce:
        say(start)
    t0 = time.monotonic()
    yield
    elapsed = time.monotonic() - t0
    if elapsed >= _QUIET_S:
        say(f"{done} in {elapsed:.0f} s")


def load_kernels_with_progress() -> None:
    """Build or load the CPU kernels now, saying so when it is the slow first build."""
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    if load_cpu_kernels.cache_info().currsize:  # this process has them already
        return
    with phase("CPU kernels: loading (the first run of a new version compiles them: 1-2 min, "
               "then cached in ~/.cache/cadence/kernels)", "CPU kernels ready"):
        load_cpu_kernels()
