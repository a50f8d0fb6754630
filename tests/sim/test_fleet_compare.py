"""`cadence sim --compare RUN.json RUN.json ...`: several measured replica_bench runs replayed,
each by its own records, and the median measured TTFT p50 set against the median simulated one
(sim/fleet_compare.py)."""

from __future__ import annotations

import json
import statistics

import pytest

from cadence.core.step_profile import ProfileShape, build_plan, profile_rows
from cadence.sim.cli import main
from cadence.sim.fleet_compare import engine_calibrations, medians_over_runs


def _row(run, policy, real_p50, sim_p50, real_hit=0.5, sim_hit=0.4):
    return {"run": run, "replicas": 2, "policy": policy,
            "real": {"hit": real_hit, "ttft_p50": real_p50, "ttft_p99": 2 * real_p50},
            "sim": {"hit": sim_hit, "ttft_p50": sim_p50}}


def test_medians_over_runs_pair_each_policys_runs():
    rows = [_row(0, "round-robin", 1.0, 0.8), _row(0, "cache-aware", 0.5, 0.6),
            _row(1, "round-robin", 1.6, 1.3), _row(1, "cache-aware", 0.7, 0.7),
            _row(2, "round-robin", 0.8, 1.1, real_hit=0.3), _row(2, "cache-aware", 0.6, 0.5)]
    medians = medians_over_runs(rows)
    assert [m["policy"] for m in medians] == ["round-robin", "cache-aware"]
    rr, ca = medians
    assert rr["runs"] == 3 and rr["real"]["ttft_p50_runs"] == [1.0, 1.6, 0.8]
    # Each side's own median: measured 1.0 (of 0.8, 1.0, 1.6), simulated 1.1 (0.8, 1.1, 1.3).
    assert rr["real"]["ttft_p50"] == 1.0 and rr["sim"]["ttft_p50"] == 1.1
    assert rr["ttft_p50_error"] == pytest.approx(0.1)
    assert rr["real"]["hit"] == 0.5 and ca["ttft_p50_error"] == pytest.approx(0.0)
    # A table's own median rows are not runs.
    assert medians_over_runs(rows + medians) == medians


def _results(path, p50s):
    """A replica_bench results.json: two short conversations, one row per policy."""
    records = [{"conversation": conv, "turn": k, "system": conv, "prompt_tokens": p,
                "output_tokens": 8, "think": 0.1, "sent": 0.5 * conv + 2.0 * k}
               for conv, prompts in ((0, (120, 180, 240)), (1, (90, 150)))
               for k, p in enumerate(prompts)]
    rows = [{"replicas": 2, "policy": policy, "prefix_hit_rate": 0.3, "ttft_p50": p50,
             "ttft_p99": 3 * p50, "hop_s": 0.01, "system_tokens": {"0": 40, "1": 30},
             "records": records} for policy, p50 in p50s.items()]
    path.write_text(json.dumps({"args": {"serve_args": "--num-kv-blocks 64"},
                                "results": rows}))
    return str(path)


def test_compare_several_runs_reports_the_median_of_each_side(tmp_path):
    runs = [_results(tmp_path / f"run{i}.json", {"round-robin": rr, "cache-aware": ca})
            for i, (rr, ca) in enumerate(((0.2, 0.1), (0.4, 0.3), (0.9, 0.2)))]
    out = tmp_path / "sim.json"
    assert main(["--compare", *runs, "--routing-policies", "round-robin,cache-aware",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    per_run = [r for r in rows if r["run"] != "median"]
    medians = {r["policy"]: r for r in rows if r["run"] == "median"}
    assert sorted({r["run"] for r in per_run}) == [0, 1, 2] and len(per_run) == 6
    for policy, real in (("round-robin", [0.2, 0.4, 0.9]), ("cache-aware", [0.1, 0.3, 0.2])):
        m = medians[policy]
        sims = [r["sim"]["ttft_p50"] for r in per_run if r["policy"] == policy]
        assert m["real"]["ttft_p50_runs"] == real and m["sim"]["ttft_p50_runs"] == sims
        assert m["real"]["ttft_p50"] == statistics.median(real)
        assert m["sim"]["ttft_p50"] == statistics.median(sims)
        assert m["ttft_p50_error"] == pytest.approx(
            (statistics.median(sims) - statistics.median(real)) / statistics.median(real))


def test_profiles_are_one_for_all_runs_or_one_per_run(tmp_path, capsys):
    runs = [_results(tmp_path / f"run{i}.json", {"round-robin": 0.2}) for i in range(3)]
    profiles = [str(tmp_path / f"cal{i}.json") for i in range(2)]
    for p in profiles:
        (tmp_path / p).write_text("{}")
    assert main(["--compare", *runs, "--calibration", *profiles]) == 2
    assert "one per --compare run" in capsys.readouterr().err


def test_a_runs_engine_profiles_seed_its_replicas_schedulers():
    # replica_bench.py copies each engine's startup profile from its trace's meta line into
    # the row (`engine_profiles`); the replay rebuilds each replica's (plan, seconds) samples,
    # None where an engine recorded none, and nothing for runs from before the meta line had it.
    shapes = [ProfileShape(decodes=4), ProfileShape(chunk=256), ProfileShape(decodes=2, chunk=128)]
    samples = [(build_plan(s, 16, 1 << 20), 0.01 * (i + 1)) for i, s in enumerate(shapes)]
    engines = engine_calibrations({"engine_profiles": [profile_rows(samples), None]}, 16)
    assert engines[1] is None
    assert [(p.chunks, s) for p, s in engines[0]] == [(p.chunks, s) for p, s in samples]
    assert engine_calibrations({"engine_profiles": [None, []]}, 16) is None
    assert engine_calibrations({}, 16) is None
