"""Think-time distributions of the multi-turn workloads (sim/think_time.py): deterministic given
the seed, constant gives the constant, uniform stays in its band, exponential keeps the stream
the benchmark's recorded runs were drawn from, and one seed gives the same conversations under
every distribution (only the think times differ), in the simulator's synthetic conversations
and in benchmarks/replica_bench.py's texts alike."""

from __future__ import annotations

import random
import statistics

import pytest

from cadence.sim.conversations import synthetic
from cadence.sim.think_time import THINK_DISTS, ThinkTime
from tests.bench.bench_modules import load_benchmark


def draws(think: ThinkTime, seed: int, n: int = 400) -> list[float]:
    rng = random.Random(seed)
    return [think.draw(rng) for _ in range(n)]


@pytest.mark.parametrize("dist", THINK_DISTS)
def test_same_seed_same_think_times(dist):
    think = ThinkTime(dist, 2.0)
    assert draws(think, 7) == draws(think, 7)
    if dist != "constant":
        assert draws(think, 7) != draws(think, 8)


def test_constant_gives_the_constant():
    assert set(draws(ThinkTime("constant", 2.0), 3)) == {2.0}


def test_uniform_stays_in_its_band_around_the_mean():
    values = draws(ThinkTime("uniform", 2.0, spread=0.25), 5, 2000)
    assert min(values) >= 1.5 and max(values) <= 2.5
    assert max(values) - min(values) > 0.9  # it spreads over the band, not one value
    assert statistics.fmean(values) == pytest.approx(2.0, abs=0.05)


def test_exponential_is_random_expovariate_draw_for_draw():
    # The recorded runs of workload R drew rng.expovariate(1 / mean): same seed, same times.
    rng = random.Random(11)
    assert draws(ThinkTime("exponential", 2.0), 11, 50) == [rng.expovariate(0.5)
                                                            for _ in range(50)]


def test_zero_mean_draws_nothing():
    rng = random.Random(1)
    assert ThinkTime("uniform", 0.0).draw(rng) == 0.0
    assert rng.random() == random.Random(1).random()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        ThinkTime("pareto", 1.0)
    with pytest.raises(ValueError):
        ThinkTime("uniform", 1.0, spread=1.5)


def test_synthetic_conversations_differ_only_in_think_times():
    runs = {d: synthetic(12, 0.5, think_mean_s=2.0, seed=4, think_dist=d) for d in THINK_DISTS}
    shape = {d: [(c.start_s, c.system, [(t.new_tokens, t.output_tokens) for t in c.turns])
                 for c in w.conversations] for d, w in runs.items()}
    assert shape["constant"] == shape["exponential"] == shape["uniform"]
    assert {t.think_s for c in runs["constant"].conversations for t in c.turns} == {2.0}
    exp_think = [t.think_s for c in runs["exponential"].conversations for t in c.turns]
    assert len(set(exp_think)) == len(exp_think)


def test_replica_bench_workload_differs_only_in_think_times():
    bench = load_benchmark("replica_bench")
    runs = {d: bench.workload(0, "tag", 6, 3, 10, 5, 0.5, think_s=2.0, turn_doc_words=20,
                              think_dist=d) for d in THINK_DISTS}
    strip = {d: [{k: v for k, v in c.items() if k != "think"} for c in convs]
             for d, convs in runs.items()}
    assert strip["constant"] == strip["exponential"] == strip["uniform"]
    assert all(c["think"] == [2.0] * 8 for c in runs["constant"])
    assert all(1.5 <= t <= 2.5 for c in runs["uniform"] for t in c["think"])
    assert runs["exponential"] != runs["constant"]

