"""The fleet simulator against a measured run: a benchmarks/replica_bench.py run on 2 replicas
(every request's record) and the machine profile taken right after it on the same quiet host
(tests/sim/data/replica_run_2x.json: 16 RAG-chat conversations, 384 KV blocks per replica,
Zen 4, load 1.6-1.9), replayed as `cadence sim --compare` does. What the model (the real
scheduler and prefix cache, interjection, the calibrated step cost, the run's measured hop)
gets right is pinned here: each policy's hit rate within 0.09, the policies' TTFT p50 in the
measured order, each within 50% (measured: -45% round-robin, -24% least-loaded, -18%
cache-aware: the simulator is optimistic; the issue's 15% is not reached, see
docs/performance.md#replicas-and-routing: the replicas serve slower than the lone one-thread
profile prices their steps)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.calibration import cost_model_from_samples, load_profile
from cadence.sim.conversations import from_replica_bench
from cadence.sim.fleet import simulate_fleet

RUN = Path(__file__).parent / "data" / "replica_run_2x.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = json.loads(RUN.read_text())
    profile = tmp_path_factory.mktemp("profile") / "cal.json"
    profile.write_text(json.dumps(data["calibration"]))
    samples = load_profile(profile)
    words = shlex.split(data["args"]["serve_args"])
    blocks = int(words[words.index("--num-kv-blocks") + 1])
    return data, samples, cost_model_from_samples(samples), blocks


def test_the_fleet_simulator_reproduces_a_measured_two_replica_run(run):
    data, samples, cost, blocks = run
    real, simulated = {}, {}
    for row in data["results"]:
        policy = row["policy"]
        sim = simulate_fleet(from_replica_bench(row), row["replicas"], policy, cost,
                             SchedulerConfig(), CacheConfig(block_size=16, num_blocks=blocks),
                             hop_s=row["hop_s"], calibration=samples)
        assert len(sim.requests) == len(row["records"])
        assert sorted(r.prompt_tokens for r in sim.requests) == sorted(
            r["prompt_tokens"] for r in row["records"])
        assert abs(sim.prefix_hit_rate - row["prefix_hit_rate"]) <= 0.09, (
            policy, sim.prefix_hit_rate, row["prefix_hit_rate"])
        error = (sim.ttft_p50 - row["ttft_p50"]) / row["ttft_p50"]
        assert abs(error) <= 0.5, (policy, sim.ttft_p50, row["ttft_p50"])
        real[policy], simulated[policy] = row["ttft_p50"], sim.ttft_p50
    assert sorted(real, key=real.get) == sorted(simulated, key=simulated.get) == [
        "cache-aware", "least-loaded", "round-robin"]
