"""How long a step takes in the simulator: a function of the plan, and nothing else.

`RooflineCostModel` charges a step the sum of its memory time and its compute time:

    t = overhead
        + (weight bytes + KV bytes read and written) / bandwidth
        + (2 * layer params * tokens + 2 * LM-head params * sampled rows) / GEMM rate
        + 4 * layers * heads * head_dim * attention pairs / attention rate

A sum rather than a max: a small model on a CPU runs its phases one after another rather than
overlapping them, and the sum is what makes a long prefill stall every stream in its step.
`LinearCostModel` is the same shape as the scheduler's online StepCostModel, with fixed
coefficients (e.g. fitted from a trace file).
"""

from __future__ import annotations

import math
from typing import Protocol

from cadence.core.plan import StepPlan
from cadence.core.step_cost import CURVE_MIN_TOKENS, StepCostCoefficients, StepFeatures
from cadence.sim.hardware import HardwareProfile
from cadence.sim.model_shape import ModelShape


class CostModel(Protocol):
    """Seconds the executor would spend on `plan`."""

    name: str

    def step_time(self, plan: StepPlan) -> float: ...


class RooflineCostModel:
    """A roofline of one model on one device (see the module docstring)."""

    def __init__(self, model: ModelShape, hardware: HardwareProfile) -> None:
        self.model = model
        self.hardware = hardware
        self.name = f"roofline {model.name} on {hardware.name}"

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        m, hw = self.model, self.hardware
        num_tokens = plan.num_tokens
        num_sampled = sum(1 for c in plan.chunks if c.sample)
        # Each chunk reads its whole context's KV once per layer (flash-style) and writes its
        # new positions.
        kv_positions = sum(c.end_pos for c in plan.chunks) + num_tokens
        pairs = StepFeatures.of_plan(plan).attention_pairs
        memory_bytes = m.weight_bytes + kv_positions * m.kv_bytes_per_token
        gemm_flops = 2 * m.layer_params * num_tokens + 2 * m.lm_head_params * num_sampled
        return (
            hw.step_overhead_s
            + memory_bytes / hw.memory_bandwidth_bytes_s
            + gemm_flops / hw.gemm_flops_s
            + m.attention_flops_per_pair * pairs / hw.attention_rate
        )


class LinearCostModel:
    """t = base + per-prefill-token + per-decode-token + per-attention-pair + per-context-pair
    + prompt-step terms (core/step_cost.py).

    `decode_only`, when given, prices the steps the fused decode stack takes (decode-only
    batches and chunks of at most FUSED_STEP_MAX_CHUNK tokens: StepFeatures.prompt_step 0) with
    their own coefficients: on CPU the stack has a few ms of fixed cost while the per-op path
    has tens, and one linear fit over both charged every decode step the per-op path's fixed
    cost (the simulated streams' ITL came out 1.8-2x the real one)."""

    def __init__(self, coefficients: StepCostCoefficients, name: str = "linear",
                 decode_only: StepCostCoefficients | None = None) -> None:
        self.coefficients = coefficients
        self.decode_only = decode_only
        self.name = name
        # (chunk tokens, seconds per prompt token) measured by a profile: prompt chunks of at
        # least CURVE_MIN_TOKENS are priced on it instead of the constant per-token term
        # (core/step_cost.py prompt_token_curve; empty: the linear model alone).
        self.prompt_token_curve: tuple[tuple[int, float], ...] = ()
        # (fixed, per sequence) seconds a real engine's step costs outside its executor
        # (cadence.sim.validate.measure_engine_overhead); zero: the executor's time alone.
        self.engine_overhead: tuple[float, float] = (0.0, 0.0)
        # Steps the fused stack takes, priced by their row count (interpolated between the
        # profile's steps) plus a per-pair attention cost, when a profile gives one
        # (cadence.sim.calibration.stack_row_curve); None: `decode_only`'s linear fit.
        self.stack_rows: StackRowCurve | None = None

    def prompt_step_time(self, features: StepFeatures) -> float:
        """The linear model's seconds for `features` as a step with a prompt chunk."""
        return self._linear(features, self.coefficients)

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        return self.features_time(StepFeatures.of_plan(plan), len(plan.chunks))

    def features_time(self, f: StepFeatures, num_seqs: int) -> float:
        """Seconds of a step of `f` over `num_seqs` sequences (step_time of its plan)."""
        fixed, per_seq = self.engine_overhead
        overhead = fixed + per_seq * num_seqs
        if self.stack_rows is not None and not f.prompt_step:
            return max(0.0, self.stack_rows.seconds(f)) + overhead
        c = self.coefficients
        if self.decode_only is not None and not f.prompt_step:
            c = self.decode_only
        seconds = self._linear(f, c)
        # A prompt token's GEMM work costs what a row costs in a GEMM of the step's rows (all
        # its chunks and decodes go through the same weight pass): priced by chunk, a step of
        # four 51-token prompts took the constant per-token term, 19% short on Zen 4 bf16.
        rows = f.num_tokens
        if f.prefill_tokens and rows >= CURVE_MIN_TOKENS and self.prompt_token_curve:
            seconds += (interpolate_log(self.prompt_token_curve, rows) - c.per_prefill_token_s) * f.prefill_tokens
        return max(0.0, seconds) + overhead

    @staticmethod
    def _linear(f: StepFeatures, c: StepCostCoefficients) -> float:
        return (
            c.base_s
            + c.per_prefill_token_s * f.prefill_tokens
            + c.per_decode_token_s * f.decode_tokens
            + c.per_attention_pair_s * f.attention_pairs
            + c.per_context_pair_s * f.context_pairs
            + c.prompt_step_s * f.prompt_step
        )


class StackRowCurve:
    """A fused-stack step's seconds: a cost by its row count, interpolated linearly between the
    profile's steps (each less its attention), plus `per_pair` seconds per attention pair.

    Why not linear in rows: the stack's integer GEMMs take rows a few at a time, so on Zen 4's
    int4 stack 1, 2 and 4 rows cost about the same (4.6-5.0 ms) and 8 twice that (11.9 ms); a
    linear fit of that put the difference on the attention pairs and priced every decode step
    at context 100-300 25-30% high."""

    def __init__(self, points: list[tuple[int, float]], per_pair: float) -> None:
        if not points:
            raise ValueError("a stack row curve needs at least one point")
        self.points = sorted(points)
        self.per_pair = per_pair

    def rows_cost(self, rows: int) -> float:
        pts = self.points
        if rows <= pts[0][0] or len(pts) == 1:
            return pts[0][1] if rows <= pts[0][0] else pts[0][1] * rows / max(1, pts[0][0])
        for (r0, c0), (r1, c1) in zip(pts, pts[1:]):
            if rows <= r1:
                return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        (r0, c0), (r1, c1) = pts[-2], pts[-1]
        return c1 + max(0.0, (c1 - c0) / (r1 - r0)) * (rows - r1)

    def seconds(self, f: StepFeatures) -> float:
        return self.rows_cost(f.num_tokens) + self.per_pair * f.attention_pairs


def interpolate_log(curve: tuple[tuple[int, float], ...], x: int) -> float:
    """The curve's value at x: linear in log x between its points, its end values beyond them.
    (Measured as it is: unlike the slo floor's curve, not forced to fall with size, which let
    one low small-chunk point price every larger step low.)"""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return curve[-1][1]
