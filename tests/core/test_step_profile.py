"""The startup profile sizes itself by the model's cost: a fast model gets the full profile, a
slow one (the 8B shape on 2 cores) smaller chunks and fewer rounds within the time budget."""

from __future__ import annotations

from cadence.core.plan import StepOutput, StepPlan
from cadence.core.step_cost import CURVE_MIN_TOKENS
from cadence.core.step_profile import (
    DEFAULT_SHAPES,
    MIN_SCALED_CHUNK,
    PROBE_TOKENS,
    ProfileShape,
    profile_cost_tokens,
    profile_step_rounds,
    scale_shape,
    scaled_shapes,
)


class ClockedExecutor:
    """Advances a fake clock by `fixed_s` plus `per_token_s` per token of each plan it runs."""

    def __init__(self, per_token_s: float, fixed_s: float = 0.0) -> None:
        self.now = 0.0
        self.per_token_s = per_token_s
        self.fixed_s = fixed_s
        self.plans: list[StepPlan] = []

    def clock(self) -> float:
        return self.now

    def execute(self, plan: StepPlan) -> StepOutput:
        self.plans.append(plan)
        self.now += self.fixed_s + self.per_token_s * (plan.num_prefill_tokens
                                                       + plan.num_decode_tokens)
        return StepOutput(step_id=plan.step_id, sampled={})


def run_profile(executor: ClockedExecutor, budget_s: float | None):
    return profile_step_rounds(executor.execute, 16, 1 << 20, 8192, budget_s=budget_s,
                               clock=executor.clock)


def largest_chunk(rounds) -> int:
    return max(p.num_prefill_tokens for p, _ in rounds)


def test_a_fast_model_gets_the_full_profile():
    executor = ClockedExecutor(per_token_s=0.001, fixed_s=0.005)  # SmolLM2-like
    rounds = run_profile(executor, budget_s=20.0)
    unscaled = run_profile(ClockedExecutor(0.001, 0.005), budget_s=None)
    assert [p.chunks for p, _ in rounds] == [p.chunks for p, _ in unscaled]
    assert all(len(times) == 2 for _, times in rounds)
    assert largest_chunk(rounds) == 1024


def test_a_slow_model_profiles_smaller_chunks_within_the_budget():
    # An 8B-like model on 2 cores: 60 ms a prompt token; the full profile is ~5600 tokens
    # (5.6 minutes).
    executor = ClockedExecutor(per_token_s=0.06, fixed_s=0.05)
    rounds = run_profile(executor, budget_s=20.0)
    timed_tokens = sum(p.num_prefill_tokens + p.num_decode_tokens for p in executor.plans)
    probe_tokens = 2 * PROBE_TOKENS
    # What the profile itself ran stays near the budget (the smallest profile is the floor).
    smallest = [p for p, _ in run_profile(ClockedExecutor(0.06, 0.05), budget_s=1e-9)]
    assert timed_tokens - probe_tokens <= max(20.0 / 0.06, profile_cost_tokens(smallest, 1))
    assert largest_chunk(rounds) < 1024
    # The per-token curve keeps at least two sizes to compare (lone chunks from position 0).
    lone = {p.num_prefill_tokens for p, _ in rounds
            if p.num_decode_tokens == 0 and p.chunks[0].start_pos == 0
            and p.num_prefill_tokens >= CURVE_MIN_TOKENS}
    assert len(lone) >= 2, lone
    # The fused-stack boundary shapes keep their sizes.
    assert {p.num_prefill_tokens for p, _ in rounds} >= {32, 48}
    # Still one timing per shape and round, each shape once.
    assert len({tuple(c.num_new_tokens for c in p.chunks) + (p.chunks[0].start_pos,)
                for p, _ in rounds}) == len(rounds)


def test_scaling_divides_large_chunks_and_keeps_positions():
    shape = ProfileShape(decodes=8, decode_ctx=256, chunk=512, chunk_start=1408)
    assert scale_shape(shape, 0) == shape
    # Positions and contexts stay: they pin the per-pair cost.
    assert scale_shape(shape, 2) == ProfileShape(decodes=8, decode_ctx=256, chunk=128,
                                                 chunk_start=1408)
    assert scale_shape(ProfileShape(decodes=8, decode_ctx=256), 3).decode_ctx == 256
    assert scale_shape(ProfileShape(chunk=48), 3).chunk == 48
    assert scale_shape(ProfileShape(chunk=256), 3).chunk == MIN_SCALED_CHUNK
    scaled = scaled_shapes(DEFAULT_SHAPES, 3)
    assert len(scaled) == len(set(scaled)) < len(DEFAULT_SHAPES)
