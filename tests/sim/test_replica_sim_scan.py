"""benchmarks/replica_sim_scan.py's routing-only ceiling: the cache-aware / round-robin hit ratio
that routing alone gives with 2 replicas (docs/performance.md#replicas-and-routing)."""

from __future__ import annotations

import pytest

from cadence.sim.conversations import synthetic
from tests.bench.bench_modules import load_benchmark


def test_routing_alone_gives_at_most_2x_with_2_replicas():
    # The ceiling the hit-rate ratio meets when round-robin keeps its same-replica prefixes
    # and loses the other replica's older ones: exactly 2 when the system prompt fills no
    # block (no hit both policies share), below 2 when its blocks are cached everywhere.
    scan = load_benchmark("replica_sim_scan")
    tiny = synthetic(12, 0.5, system_tokens=15, doc_tokens=0, user_tokens=178,
                     output_tokens=48, think_mean_s=2.0, seed=1)
    assert scan.routing_only_ratio(tiny) == pytest.approx(2.0)
    shared = synthetic(12, 0.5, system_tokens=45, doc_tokens=0, user_tokens=178,
                       output_tokens=48, think_mean_s=2.0, seed=1)
    assert 1.8 < scan.routing_only_ratio(shared) < 1.95
