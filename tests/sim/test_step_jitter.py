"""Step-time spread in the simulator: measured from a profile's rounds, drawn per step (seeded),
and the validation's pairing of one real run with the median of several such simulations."""

from __future__ import annotations

import pytest

from cadence.core.config import SchedulerConfig
from cadence.core.step_profile import ProfileShape, build_plan
from cadence.sim.cost_model import RooflineCostModel
from cadence.sim.hardware import get_profile
from cadence.sim.metrics import percentile
from cadence.sim.model_shape import SMOLLM2_135M
from cadence.sim.simulator import simulate
from cadence.sim.step_jitter import StepJitter
from cadence.sim.validate import Case, compare
from cadence.sim.workload import doc_burst

COST = RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core"))
CHUNKED = SchedulerConfig(policy="chunked", max_num_batched_tokens=128)
BURST = doc_burst(num_streams=3, stream_prompt_tokens=48, stream_output_tokens=40,
                  doc_prompt_tokens=512, doc_output_tokens=4, doc_arrival_s=0.15,
                  stream_arrival_window_s=0.0)


def plan(**shape):
    return build_plan(ProfileShape(**shape), 16, 1 << 20)


def mean_ttft(result) -> float:
    values = [t.ttft for t in result.timelines.values()]
    return sum(values) / len(values)


def p99_itl(result) -> float:
    return percentile([g for t in result.timelines.values() for g in t.itl], 99)


def test_the_spread_is_each_round_over_its_shapes_median_pooled_by_step_kind():
    rounds = [
        (plan(chunk=256), [0.10, 0.12, 0.20]),           # a prompt step: ratios 1/1.2, 1, 1.667
        (plan(chunk=512), [0.40, 0.40, 0.44]),
        (plan(decodes=4), [0.004, 0.005, 0.004]),        # fused-stack steps: their own spread
        (plan(decodes=8), [0.006, 0.006, 0.006]),
    ]
    jitter = StepJitter.from_rounds(rounds)
    assert jitter.prompt_ratios == pytest.approx(sorted([1 / 1.2, 1.0, 1 / 0.6, 1.0, 1.0, 1.1]))
    assert jitter.stack_ratios == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 1.25])
    draws = {jitter.factor(plan(chunk=128)) for _ in range(200)}
    assert draws == set(jitter.prompt_ratios)
    assert {jitter.factor(plan(decodes=2)) for _ in range(200)} == {1.0, 1.25}
    # Two rounds give no spread around a median; a kind without enough rounds gets none.
    assert StepJitter.from_rounds([(p, t[:2]) for p, t in rounds]) is None
    only_prompt = StepJitter.from_rounds(rounds[:2])
    assert only_prompt.factor(plan(decodes=2)) == 1.0
    assert "prompt steps mean x" in jitter.describe()


def test_a_jittered_simulation_is_reproducible_and_a_flat_spread_changes_nothing():
    spread = StepJitter([1.0, 1.0, 1.0, 1.3, 1.6, 0.9], [1.0, 1.1, 0.95, 1.0, 1.0, 1.2])
    a = simulate(BURST, CHUNKED, COST, jitter=spread.reseeded(3))
    b = simulate(BURST, CHUNKED, COST, jitter=spread.reseeded(3))
    c = simulate(BURST, CHUNKED, COST, jitter=spread.reseeded(4))
    assert [s.duration_s for s in a.steps] == [s.duration_s for s in b.steps]
    assert [s.duration_s for s in a.steps] != [s.duration_s for s in c.steps]
    flat = StepJitter([1.0] * 6, [1.0] * 6)
    plain = simulate(BURST, CHUNKED, COST)
    assert [s.duration_s for s in simulate(BURST, CHUNKED, COST, jitter=flat).steps] == \
        [s.duration_s for s in plain.steps]


def test_a_spread_skewed_to_the_slow_side_raises_the_tail_and_the_mean():
    """Why the validation models the spread: p99 ITL is the worst of a few stalls and a mean
    TTFT a sum of steps; with steps now and then slower than their median, both sit above what
    median steps give, and never beyond the largest ratio."""
    skewed = StepJitter([1.0, 1.0, 1.0, 1.0, 1.25, 1.5], [1.0] * 6)
    plain = simulate(BURST, CHUNKED, COST)
    runs = [simulate(BURST, CHUNKED, COST, jitter=skewed.reseeded(s)) for s in range(9)]
    p99s = sorted(p99_itl(r) for r in runs)
    ttfts = sorted(mean_ttft(r) for r in runs)
    assert p99_itl(plain) < p99s[4] <= 1.5 * p99_itl(plain)
    assert mean_ttft(plain) < ttfts[4] <= 1.5 * mean_ttft(plain)


def test_a_pair_with_several_simulations_is_compared_on_their_median():
    case = Case("burst", BURST, CHUNKED)
    real = simulate(BURST, CHUNKED, COST)  # stands in for a real run: same result type
    spread = StepJitter([0.8, 1.0, 1.0, 1.2, 1.5, 2.0], [1.0] * 6)
    seeds = [simulate(BURST, CHUNKED, COST, jitter=spread.reseeded(s)) for s in range(5)]
    rows = {r.metric: r for r in compare(case, [real, real], [seeds, seeds])}
    p99 = rows["p99 ITL (all requests)"]
    want = sorted(p99_itl(s) for s in seeds)[2]
    assert p99.sim_s == pytest.approx(want)
    assert p99.error == pytest.approx((want - p99_itl(real)) / p99_itl(real))
    # One simulation per pair, as before, still compares.
    rows = {r.metric: r for r in compare(case, real, real)}
    assert rows["mean TTFT"].error == pytest.approx(0.0)
