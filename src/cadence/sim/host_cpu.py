"""The cores a fleet of replicas shares with the rest of its serving stack (sim/fleet.py).

On one host (benchmarks/replica_bench.py runs every process on one machine) the replicas'
engines are not alone on the cores: each replica's front end (HTTP, SSE per token), the
routers, the engines' admission threads and the load generator run beside them. Measured on
the 2-core Zen 4 host (docs/performance.md#replicas-and-routing) they took 0.1-0.3 cores while
both engines computed, so a step there ran slower than the one-thread profile prices it, and
only while the other replica was busy too (one busy engine leaves a core for the rest).

The model is processor sharing: every runnable thread gets an equal share of the cores, at
most one core. Runnable are each busy replica's engine threads, the stack's steady demand
(`idle_cores`: health checks, stats heartbeats, metric scrapes) and one thread per pending
piece of per-request or per-token work (`cpu_per_request_s` when a request is sent,
`cpu_per_token_s` times the tokens a step delivers, when it ends). A replica's step then
advances at `rate` solo-seconds per second: min(1, cores / runnable threads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostCpu:
    """One host's cores and the CPU the serving stack around the engines takes from them."""

    cores: float
    threads_per_replica: int = 1
    idle_cores: float = 0.0
    cpu_per_request_s: float = 0.0
    cpu_per_token_s: float = 0.0
    # How much slower an engine's step runs while the other cores compute engine steps too,
    # beyond its share of the cores (caches and memory bandwidth the replicas' separate weight
    # copies share): measured from a run's traced steps (sim/run_speed.py). Below 1 where the
    # traced steps beside each other ran faster than processor sharing with the stack gives
    # (its CPU fell mostly between the engines' steps).
    corun_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.threads_per_replica < 1:
            raise ValueError("a host needs cores > 0 and at least one thread per replica")
        if min(self.idle_cores, self.cpu_per_request_s, self.cpu_per_token_s) < 0:
            raise ValueError("the stack's CPU costs cannot be negative")
        if self.corun_slowdown <= 0:
            raise ValueError("corun_slowdown is a factor on step time: > 0")

    def rate(self, busy_replicas: int, background_tasks: int) -> float:
        """Solo-seconds of work each runnable thread does per second."""
        runnable = busy_replicas * self.threads_per_replica + self.idle_cores + background_tasks
        return 1.0 if runnable <= self.cores else self.cores / runnable

    def engine_rate(self, busy_replicas: int, background_tasks: int) -> float:
        """Solo-seconds of step work a busy replica does per second: its threads' share of the
        cores, slowed by `corun_slowdown` as far as the other cores compute engine steps too
        (all of it when every core does, none with one core busy)."""
        busy_cores = min(self.cores, busy_replicas * self.threads_per_replica)
        spare = max(1e-9, self.cores - self.threads_per_replica)
        others = (busy_cores - self.threads_per_replica) / spare
        slowdown = 1.0 + (self.corun_slowdown - 1.0) * min(1.0, max(0.0, others))
        return self.rate(busy_replicas, background_tasks) / slowdown

    def describe(self) -> str:
        return (f"{self.cores:g} cores shared by {self.threads_per_replica} engine thread(s) per "
                f"replica and the stack: {self.idle_cores:.3f} cores steady, "
                f"{self.cpu_per_request_s * 1e3:.1f} ms per request, "
                f"{self.cpu_per_token_s * 1e3:.2f} ms per token; co-running steps "
                f"{self.corun_slowdown:.2f}x")


def host_from_run(row: dict) -> HostCpu | None:
    """The host of a benchmarks/replica_bench.py result row, from what it measured: its cores,
    each replica's share of them (the launcher's cores // replicas threads), and the CPU the
    rest of the stack took (every role of `cpu_samples` but the engines' loop threads),
    fitted per sampling interval as steady + per request sent + per token streamed (least
    squares, no negative term). None when the row has no CPU samples."""
    samples = row.get("cpu_samples") or []
    cores = row.get("cores")
    if len(samples) < 4 or not cores:
        return None
    threads = max(1, int(cores) // int(row["replicas"]))
    times = [t for t, _ in samples]
    others = [sum(v for k, v in c.items() if k != "engine_loop") for _, c in samples]
    requests = [0.0] * (len(samples) - 1)
    tokens = [0.0] * (len(samples) - 1)
    for rec in row["records"]:
        if rec.get("ttft") is None:
            continue
        _spread(requests, times, rec["sent"], rec["sent"], 1.0)
        first, end = rec["sent"] + rec["ttft"], rec["sent"] + rec.get("e2e", rec["ttft"])
        _spread(tokens, times, first, end, float(rec.get("output_tokens") or 0))
    rows = [(times[i + 1] - times[i], requests[i], tokens[i], others[i + 1] - others[i])
            for i in range(len(samples) - 1) if times[i + 1] > times[i]]
    idle, per_request, per_token = _nonnegative_least_squares(rows)
    return HostCpu(float(cores), threads, idle, per_request, per_token)


def _spread(bins: list[float], edges: list[float], start: float, end: float,
            amount: float) -> None:
    """Add `amount`, spread evenly over [start, end] (all at start when end <= start), to the
    bins between consecutive `edges`."""
    if amount <= 0:
        return
    for i in range(len(bins)):
        lo, hi = edges[i], edges[i + 1]
        if end <= start:
            if lo <= start < hi:
                bins[i] += amount
                return
            continue
        overlap = min(hi, end) - max(lo, start)
        if overlap > 0:
            bins[i] += amount * overlap / (end - start)


def _nonnegative_least_squares(rows: list[tuple[float, float, float, float]]) -> list[float]:
    """Coefficients (>= 0) of y ~ a x0 + b x1 + c x2 over rows (x0, x1, x2, y): least squares
    on the terms still free, dropping the most negative one until none is."""
    free = [0, 1, 2]
    while free:
        k = len(free)
        ata = [[sum(r[i] * r[j] for r in rows) for j in free] for i in free]
        aty = [sum(r[i] * r[3] for r in rows) for i in free]
        solution = _solve(ata, aty)
        if solution is None:
            free.pop()
            continue
        if min(solution) >= 0:
            coef = [0.0, 0.0, 0.0]
            for i, v in zip(free, solution):
                coef[i] = v
            return coef
        free.pop(min(range(k), key=lambda i: solution[i]))
    return [0.0, 0.0, 0.0]


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]
