"""benchmarks/replica_sim_scan.py's routing-only ceiling: the cache-aware / round-robin hit ratio
that routing alone gives with 2 replicas (docs/performance.md#replicas-and-routing), and its
screening mode (two policies, a ratio bar)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def test_screening_scan_of_two_policies(tmp_path, monkeypatch, capsys):
    # Screening a point needs only the ratio's two policies (a third less of the scan's time):
    # least-loaded's columns print '-', and --bar sets the ratio the seed count is against.
    data = json.loads((Path(__file__).parent / "data" / "replica_run_2x.json").read_text())
    (tmp_path / "cal.json").write_text(json.dumps(data.pop("calibration")))
    (tmp_path / "results.json").write_text(json.dumps(data))
    scan = load_benchmark("replica_sim_scan")
    monkeypatch.setattr(sys, "argv", [
        "replica_sim_scan.py", "--run", str(tmp_path), "--seeds", "2", "--bar", "2.1",
        "--policies", "cache-aware,round-robin", "--point", "4:0.5:1:384"])
    assert scan.main() == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.lstrip().startswith("4:0.5:1:384")
    assert "(>= 2.1 in " in line and "/2;" in line
    assert " ll - " in line and "longest run ca " in line and " ll - rr " in line
    monkeypatch.setattr(sys, "argv", [
        "replica_sim_scan.py", "--run", str(tmp_path), "--policies", "cache-aware",
        "--point", "4:0.5:1:384"])
    with pytest.raises(SystemExit):
        scan.main()
