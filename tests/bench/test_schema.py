"""The result schema accepts what the bench writes and rejects broken results clearly."""

from __future__ import annotations

import copy

import pytest

from cadence.bench.config import AnalysisConfig, BenchConfig, ClientConfig, WorkloadConfig
from cadence.bench.records import Failure
from cadence.bench.report import build_result
from cadence.bench.runner import RunOutcome
from cadence.bench.schema import SCHEMA_VERSION, ResultSchemaError, validate_result, validate_sweep
from cadence.bench.token_counter import ApproxCounter
from cadence.bench.workloads import build_workload

from .records_factory import make_record


@pytest.fixture
def result():
    cfg = BenchConfig(client=ClientConfig(url="http://127.0.0.1:1"), workload=WorkloadConfig(num_requests=3))
    wl = build_workload(cfg.workload, ApproxCounter())
    records = [
        make_record(0, 0.0, [(0.1, 1), (0.2, 2)]),
        make_record(1, 0.0, [(0.3, 1)], prompt_tokens=2000, kind="document"),
        make_record(2, 0.0, [], end=0.05, failure=Failure("http", "bad", 400)),
    ]
    run = RunOutcome("run", {"kind": "concurrency", "concurrency": 2}, 0.5, records,
                     {"available": False, "note": "off", "interval_s": 0.0, "samples": []})
    return build_result(cfg, wl, [run], 1000, {"url": cfg.client.url, "model": "m"})


def test_built_result_is_valid(result):
    validate_result(result)
    assert result["schema_version"] == SCHEMA_VERSION
    assert result["environment"]["cpu_count"] >= 1
    assert "api_key" not in result["config"]["client"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("environment"), "'environment' is a required property"),
        (lambda r: r.__setitem__("schema_version", "cadence.bench/0"), "schema_version"),
        (lambda r: r["runs"][0]["records"][0].__setitem__("status", "maybe"), "records/0/status"),
        (lambda r: r["runs"][0]["records"][0]["chunk_tokens"].append(0), "chunk_tokens"),
        (lambda r: r["runs"][0]["metrics"]["ttft"].__setitem__("p99", "slow"), "metrics/ttft/p99"),
        (lambda r: r["runs"][0]["records"][2]["failure"].__setitem__("kind", "gremlins"), "failure/kind"),
        (lambda r: r.__setitem__("runs", []), "runs"),
    ],
)
def test_broken_results_are_rejected_with_the_path(result, mutate, message):
    broken = copy.deepcopy(result)
    mutate(broken)
    with pytest.raises(ResultSchemaError, match=message):
        validate_result(broken)


def test_sweep_schema_rejects_missing_choice():
    with pytest.raises(ResultSchemaError, match="choice"):
        validate_sweep({"schema_version": "cadence.sweep/1", "kind": "sweep", "created_at": "", "config": {},
                        "environment": {}, "settings": [], "pareto": []})
