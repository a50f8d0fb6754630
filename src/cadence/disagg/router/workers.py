"""Worker pools: pick the worker with the fewest outstanding tokens, skip failed ones for a
while, and keep what each worker's /metrics says about its queues."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Worker:
    url: str
    role: str  # "prefill" | "decode"
    # What this router sent and has not seen finish (tokens: prompt + expected output).
    outstanding_tokens: int = 0
    outstanding_requests: int = 0
    # The work in those tokens: prompt tokens it must compute (beyond the prefix it held when
    # the request was routed) plus the expected output tokens.
    outstanding_work: int = 0
    unhealthy_until: float = 0.0
    failures: int = 0
    # From the worker's /metrics (scraped): its own view of its queues.
    num_running: int = 0
    num_waiting: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def kv_use(self) -> float:
        """Fraction of its KV blocks held by requests (scraped; 0 until known)."""
        return float(self.metrics.get("cadence:kv_cache_usage_perc", 0.0))

    @property
    def kv_capacity_blocks(self) -> int:
        """Blocks of its KV pool (scraped; 0 until known)."""
        return int(self.metrics.get("cadence:kv_cache_blocks_total", 0))

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.unhealthy_until

    def mark_failed(self, cooldown_s: float) -> None:
        self.failures += 1
        self.unhealthy_until = time.monotonic() + cooldown_s


class WorkerPool:
    """One role's workers; least outstanding tokens first, healthy ones before failed ones."""

    def __init__(self, role: str, urls: tuple[str, ...]) -> None:
        self.role = role
        self.workers = [Worker(url.rstrip("/"), role) for url in urls]

    def __bool__(self) -> bool:
        return bool(self.workers)

    def candidates(self, exclude: set[str] = frozenset()) -> list[Worker]:
        """Workers to try in order: healthy by outstanding tokens, then the failed ones (a
        worker back from a restart is found again)."""
        live = [w for w in self.workers if w.url not in exclude]
        return sorted(live, key=lambda w: (not w.healthy, w.outstanding_tokens,
                                           w.outstanding_requests))

    def pick(self) -> Worker | None:
        order = self.candidates()
        return order[0] if order else None


class Outstanding:
    """Context manager counting one request's tokens on a worker while it runs. Exiting twice
    counts once: a stream's request ends when its last event passes (before the client can
    send its next request), and again when the generator closes."""

    def __init__(self, worker: Worker, tokens: int, work: int | None = None) -> None:
        self.worker, self.tokens = worker, tokens
        self.work = tokens if work is None else work
        self._open = False

    def __enter__(self) -> Worker:
        self.worker.outstanding_tokens += self.tokens
        self.worker.outstanding_work += self.work
        self.worker.outstanding_requests += 1
        self._open = True
        return self.worker

    def __exit__(self, *exc: object) -> None:
        if not self._open:
            return
        self._open = False
        self.worker.outstanding_tokens -= self.tokens
        self.worker.outstanding_work -= self.work
        self.worker.outstanding_requests -= 1
