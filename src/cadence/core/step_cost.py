"""An online model of how long a step takes, as a function of its plan (pure Python, no numpy).

    t = base + per_prefill_token * prefill_tokens + per_decode_token * decode_tokens
             + per_attention_pair * attention_pairs + per_context_pair * context_pairs
             + prompt_step * [the step carries a prompt chunk]

`attention_pairs` counts (query, key) pairs of causal attention: a chunk of n new tokens starting
at position s attends n*s + n(n+1)/2 pairs, which is why late chunks of a long prompt cost more
than early ones. `context_pairs` counts again the n*s of those pairs that a *prompt* chunk
attends against context cached by earlier chunks: the executor serves them on another path
than a chunk's attention over its own keys (on CPU in float32: the context gathered from the
paged cache and attended with an explicit mask, several times the cost per pair of the causal
flash kernel that a chunk from position 0 takes), so one coefficient for both under-predicted
every continuing chunk of a document by 30-50% on the Zen 3 host. It is the extra cost of such
a pair (>= 0; 0 where both paths cost the same). `prompt_step` is the fixed cost a step pays
for carrying any prompt chunk: on CPU a decode-only batch runs through the fused C++ decode
stack (a few ms) while a step with a prompt chunk takes the per-op path (tens of ms, more
under load); with one `base` for both, the fit charged decode steps the per-op cost and
under-counted what each extra prompt chunk costs. The model is linear in these six features
and is fitted online by
exponentially weighted ridge regression toward a prior:

    A = sum_i w_i x_i x_i^T,  b = sum_i w_i x_i y_i,  w_i = forgetting ** age_i
    theta = argmin_{theta >= 0} theta^T (A + R) theta - 2 theta^T (b + R theta_prior)

The prior (R) never decays, so a feature that the recent steps did not exercise (no prefill for
a while) falls back to its prior cost instead of drifting (no estimator wind-up, unlike a plain
recursive least squares with forgetting). Each observation's residual is clipped to a few times
the running mean relative residual times the prediction (step times span three orders of
magnitude, so the scale is relative), and one slow step (GC pause, page fault) barely moves it.
Features are scaled to similar magnitudes before fitting so the 6x6 solve stays well
conditioned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import mul, truediv

from cadence.core.plan import StepPlan

NUM_FEATURES = 6
# The executor's fused decode stack (cadence.model.fused_decode imports these) takes a step of
# at most FUSED_STEP_MAX_ROWS new tokens whose prompt chunks are at most FUSED_STEP_MAX_CHUNK
# long; any other step runs op by op, a fixed cost of its own (25-30 ms for SmolLM2 on two Zen 4
# cores: a 48-token chunk took 59 ms, a 32-token one 21 ms). That is the `prompt_step` feature.
FUSED_STEP_MAX_ROWS = 64
FUSED_STEP_MAX_CHUNK = 32
# Divides each raw feature so that a typical step has scaled features of order 1; the prior's
# precision is then "strength observations" per feature.
_FEATURE_SCALES = (1.0, 100.0, 10.0, 1e6, 1e6, 1.0)


@dataclass(frozen=True)
class StepFeatures:
    """What a step's time depends on: token counts by kind and causal attention work."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    attention_pairs: int = 0
    # Of attention_pairs: prompt-chunk queries against context cached by earlier chunks.
    context_pairs: int = 0
    # 1 when the step takes the per-op path: a prompt chunk longer than FUSED_STEP_MAX_CHUNK, or
    # more than FUSED_STEP_MAX_ROWS tokens (a 0/1 indicator: sums take the max, or set it when
    # their tokens pass the row bound). Short chunks ride in the fused stack and pay no more
    # fixed cost than a decode step: counted as prompt steps, a 32-token chunk's 21 ms pinned
    # the per-op fixed cost at 0 and every chunk of 40-130 tokens came out 20-25 ms short.
    prompt_step: int = 0

    def __add__(self, other: StepFeatures) -> StepFeatures:
        prefill = self.prefill_tokens + other.prefill_tokens
        decode = self.decode_tokens + other.decode_tokens
        per_op = max(self.prompt_step, other.prompt_step)
        if prefill + decode > FUSED_STEP_MAX_ROWS:
            per_op = 1
        return StepFeatures(
            prefill,
            decode,
            self.attention_pairs + other.attention_pairs,
            self.context_pairs + other.context_pairs,
            per_op,
        )

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def raw_vector(self) -> tuple[float, ...]:
        """[1, prefill, decode, attention, context attention, prompt step] in raw units (a
        step always pays base). The context-attention input is held at 0 (its coefficient stays
        at its prior, 0): a pair against cached context now costs what a causal pair costs (one
        flash kernel reads both from the paged cache: 42-49 ns per pair per layer from 16 to
        256 queries at position 1000 on Zen 3), and as a free coefficient it soaked up what
        chunking really costs (a token's GEMM work is cheaper in a large chunk, see
        StepCostModel.prior_token_cost): fitted at 0.7-1.0 us per pair next to 0.8-1.0 for a
        causal one, it priced a 2000-token document's chunks 1.2x its whole run at any count."""
        return (1.0, self.prefill_tokens, self.decode_tokens, self.attention_pairs,
                0.0, self.prompt_step)

    def vector(self) -> tuple[float, ...]:
        """Scaled regression inputs (raw_vector / the feature scales)."""
        return tuple(map(truediv, self.raw_vector(), _FEATURE_SCALES))

    @staticmethod
    def of_chunk(start_pos: int, num_new_tokens: int, is_prefill: bool = True) -> StepFeatures:
        """One chunk computing positions [start_pos, start_pos + num_new_tokens)."""
        n = num_new_tokens
        pairs = n * start_pos + n * (n + 1) // 2
        if is_prefill:
            return StepFeatures(prefill_tokens=n, attention_pairs=pairs, context_pairs=n * start_pos,
                                prompt_step=1 if n > FUSED_STEP_MAX_CHUNK else 0)
        return StepFeatures(decode_tokens=n, attention_pairs=pairs,
                            prompt_step=1 if n > FUSED_STEP_MAX_ROWS else 0)

    @staticmethod
    def of_plan(plan: StepPlan) -> StepFeatures:
        """The sum of the plan's chunks (of_chunk each, added as __add__ adds them), without a
        StepFeatures per chunk and per partial sum: this runs every step (the scheduler's
        observe_step), and at batch 8 the frozen dataclasses' construction was most of it. The
        running token count only grows, so __add__'s row bound is the total's."""
        prefill = decode = pairs = context = per_op = 0
        for c in plan.chunks:
            n, start = c.num_new_tokens, c.start_pos
            pairs += n * start + n * (n + 1) // 2
            if c.is_prefill:
                prefill += n
                context += n * start
                per_op = per_op or n > FUSED_STEP_MAX_CHUNK
            else:
                decode += n
                per_op = per_op or n > FUSED_STEP_MAX_ROWS
        if prefill + decode > FUSED_STEP_MAX_ROWS:
            per_op = True
        return StepFeatures(prefill, decode, pairs, context, int(per_op))


@dataclass(frozen=True)
class StepCostCoefficients:
    """Seconds per unit of each feature. The defaults are a roofline of SmolLM2-135M in bf16 on
    two CPU cores (44 GB/s, 380 GFLOP/s): base = 270 MB of weights / bandwidth plus framework
    overhead; a token = 2 * 106 M layer parameters of GEMM work; a decode token also pays the
    49152 x 576 LM head and sampling; an attention pair = 4 * 9 heads * 64 dims * 30 layers.
    A pair against cached context and a step with a prompt chunk cost no extra by default
    (the calibration learns them)."""

    base_s: float = 0.008
    per_prefill_token_s: float = 0.00056
    per_decode_token_s: float = 0.0008
    per_attention_pair_s: float = 1.8e-7
    per_context_pair_s: float = 0.0
    prompt_step_s: float = 0.0

    def as_tuple(self) -> tuple[float, ...]:
        return (
            self.base_s,
            self.per_prefill_token_s,
            self.per_decode_token_s,
            self.per_attention_pair_s,
            self.per_context_pair_s,
            self.prompt_step_s,
        )

    def __post_init__(self) -> None:
        for name, value in zip(_COEFFICIENT_NAMES, self.as_tuple()):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


_COEFFICIENT_NAMES = (
    "base_s",
    "per_prefill_token_s",
    "per_decode_token_s",
    "per_attention_pair_s",
    "per_context_pair_s",
    "prompt_step_s",
)


@dataclass(frozen=True)
class StepCostModelConfig:
    """How the online fit trusts its prior and its data."""

    prior: StepCostCoefficients = field(default_factory=StepCostCoefficients)
    # How many (scaled, unit-size) observations the prior weighs, per coefficient.
    prior_strength: float = 0.02
    # Weight of an observation after k more steps: forgetting ** k (0.99: a ~100-step memory,
    # seconds of serving, so a slower or busier machine is tracked within a few seconds).
    forgetting: float = 0.99
    # Residuals beyond this many running mean relative residuals (times the prediction) are
    # clipped.
    clip_residuals: float = 4.0
    # Floor of the relative clipping scale: a step may always move the fit by
    # clip_residuals * this share of its prediction (so a bad prior is unlearned in a few steps).
    min_relative_scale: float = 0.1
    # Absolute floor of the clipping limit, seconds (predictions near zero).
    min_clip_s: float = 0.0005

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prior_strength) and self.prior_strength > 0):
            raise ValueError(f"prior_strength must be > 0, got {self.prior_strength!r}")
        if not 0 < self.forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {self.forgetting!r}")
        if not (math.isfinite(self.clip_residuals) and self.clip_residuals > 0):
            raise ValueError(f"clip_residuals must be > 0, got {self.clip_residuals!r}")
        for name in ("min_relative_scale", "min_clip_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")


class StepCostModel:
    """Predicts step seconds from StepFeatures; learns from observed (plan, seconds) pairs."""

    def __init__(self, config: StepCostModelConfig | None = None) -> None:
        self.config = config or StepCostModelConfig()
        d = NUM_FEATURES
        # Prior in scaled units: seconds per scaled feature unit.
        self._prior = [c * s for c, s in zip(self.config.prior.as_tuple(), _FEATURE_SCALES)]
        self._gram = [[0.0] * d for _ in range(d)]  # A: [d, d]
        self._moment = [0.0] * d  # b: [d]
        self._theta = list(self._prior)  # current solution, scaled units
        self._theta_clamped = [max(0.0, t) for t in self._theta]  # what predictions use
        self._dirty = False
        # Running mean of |residual| / prediction (the clipping scale).
        self._relative_scale = 0.0
        self.num_observations = 0
        # (chunk tokens, seconds per prompt token) of the profile's lone prompt chunks, rising
        # chunk size (calibrate): the per-token cost by chunk size that a linear model cannot
        # express (prior_token_cost).
        self.prompt_token_curve: tuple[tuple[int, float], ...] = ()
        # Mean |residual| / prediction of the profile's fit (calibrate; 0 before): how far the
        # prior is off on this machine, the slo floor's headroom.
        self.calibration_error = 0.0

    # -- prediction -------------------------------------------------------------------------
    def predict(self, features: StepFeatures) -> float:
        """Predicted seconds of a step with these features (never negative)."""
        self._solution()
        return sum(map(mul, self._theta_clamped, features.vector()))

    def predict_plan(self, plan: StepPlan) -> float:
        return self.predict(StepFeatures.of_plan(plan))

    @property
    def relative_error(self) -> float:
        """Running mean of |measured - predicted| / predicted over recent steps (0 before
        any): how far off a prediction typically is, e.g. to leave a safety margin."""
        return self._relative_scale

    @property
    def coefficients(self) -> StepCostCoefficients:
        """The current fit in seconds per raw feature unit (all >= 0)."""
        theta = self._solution()
        return StepCostCoefficients(*(max(0.0, t) / s for t, s in zip(theta, _FEATURE_SCALES)))

    @property
    def prior_coefficients(self) -> StepCostCoefficients:
        """The prior in seconds per raw feature unit: the startup profile's fit after
        calibrate(), the configured table before."""
        return self.config.prior

    def predict_prior(self, features: StepFeatures) -> float:
        """Seconds of a step with these features under the prior alone."""
        return sum(max(0.0, c) * x for c, x in zip(self.config.prior.as_tuple(), features.raw_vector()))

    def prior_token_cost(self, chunk_tokens: int) -> float:
        """Seconds per prompt token of a chunk of `chunk_tokens` tokens: the profile's measured
        cost at that size (interpolated in log size, clamped to the sizes profiled), or the
        prior's constant per-token cost without a profile.

        Why: a token's GEMM work costs less in a large chunk than in a small one (more rows
        reuse each weight; on CPU, torch's float32 GEMM of a thousand rows runs a fifth faster
        per token than the int8 path of <= 256 rows), and that difference, not a step's fixed
        cost, is most of what chunking a document costs on a compute-bound machine. One
        per-token coefficient fitted to chunks of 32-512 tokens priced a document run whole
        10-20% too high and made chunking look nearly free."""
        return token_cost_at(self.prompt_token_curve, chunk_tokens, self.config.prior.per_prefill_token_s)

    # -- learning ---------------------------------------------------------------------------
    def observe(self, features: StepFeatures, duration_s: float) -> None:
        """Fold in one measured step. Raises ValueError on a negative or non-finite time."""
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
            raise ValueError(f"duration_s must be a number of seconds, got {duration_s!r}")
        if not math.isfinite(duration_s) or duration_s < 0:
            raise ValueError(f"duration_s must be finite and >= 0, got {duration_s!r}")
        cfg = self.config
        x = features.vector()
        predicted = self.predict(features)
        residual = duration_s - predicted
        if self.num_observations:
            scale = max(self._relative_scale, cfg.min_relative_scale)
            limit = max(cfg.clip_residuals * scale * predicted, cfg.min_clip_s)
            residual = max(-limit, min(limit, residual))
        # The scale follows the clipped residuals, so a burst of outliers widens it only
        # gradually; it starts at the first residual.
        relative = abs(residual) / max(predicted, cfg.min_clip_s)
        if self.num_observations == 0:
            self._relative_scale = relative
        else:
            self._relative_scale = 0.8 * self._relative_scale + 0.2 * relative
        y = predicted + residual
        lam = cfg.forgetting
        d = NUM_FEATURES
        for i in range(d):
            xi = x[i]
            self._moment[i] = lam * self._moment[i] + xi * y
            row = self._gram[i]
            row[:] = [lam * g + xi * xj for g, xj in zip(row, x)]
        self.num_observations += 1
        self._dirty = True

    def observe_plan(self, plan: StepPlan, duration_s: float) -> None:
        self.observe(StepFeatures.of_plan(plan), duration_s)

    def calibrate(self, samples: list[tuple[StepFeatures, float]]) -> StepCostCoefficients:
        """Make a short profile of this machine (measured steps) the model's prior and its
        current fit. The prior is what a coefficient falls back to when recent steps stop
        exercising its feature (hours of decode-only serving), so it should be this
        machine's, not a table's. Returns the fitted coefficients.

        The samples are not folded in as observations: observations are fitted by plain
        least squares, where the profile's largest steps (a 512-token chunk, seconds on a
        busy 2-core host) outweigh its 20 ms decode steps a thousand times; after that fold
        the fit of one startup had no fixed cost left at all (base, prompt step and decode
        all 0), so the slo policy saw chunking as free and cut a 2000-token document into
        125 one-block chunks (2.5x its eager time). The relative fit is the start; the
        running error scale starts at its mean relative residual."""
        fitted = fit_coefficients(samples, self.config.prior)
        self.config = StepCostModelConfig(
            prior=fitted,
            prior_strength=self.config.prior_strength,
            forgetting=self.config.forgetting,
            clip_residuals=self.config.clip_residuals,
            min_relative_scale=self.config.min_relative_scale,
            min_clip_s=self.config.min_clip_s,
        )
        self._prior = [c * s for c, s in zip(fitted.as_tuple(), _FEATURE_SCALES)]
        self._dirty = True
        residuals = [abs(seconds - self.predict(f)) / max(self.predict(f), self.config.min_clip_s)
                     for f, seconds in samples
                     if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0]
        if residuals:
            self._relative_scale = sum(residuals) / len(residuals)
            self.calibration_error = self._relative_scale
        self.prompt_token_curve = prompt_token_curve(samples, self.predict_prior)
        return fitted

    # -- internals --------------------------------------------------------------------------
    def _solution(self) -> list[float]:
        if self._dirty:
            strength = self.config.prior_strength
            matrix = [list(row) for row in self._gram]
            for i, row in enumerate(matrix):
                row[i] += strength
            rhs = [m + strength * p for m, p in zip(self._moment, self._prior)]
            self._theta = _solve_nonnegative(matrix, rhs)
            self._theta_clamped = [max(0.0, t) for t in self._theta]
            self._dirty = False
        return self._theta


def fit_coefficients(
    samples: list[tuple[StepFeatures, float]],
    prior: StepCostCoefficients | None = None,
    prior_strength: float = 1e-3,
) -> StepCostCoefficients:
    """Non-negative least squares of relative errors (each sample weighted 1 / seconds^2, so a
    30 ms decode step counts as much as a 2 s prefill), with a light ridge toward `prior`
    for features the samples do not pin down. Raises ValueError without usable samples."""
    d = NUM_FEATURES
    prior_scaled = [c * s for c, s in zip((prior or StepCostCoefficients()).as_tuple(),
                                          _FEATURE_SCALES)]
    gram = [[0.0] * d for _ in range(d)]
    moment = [0.0] * d
    used = 0
    for features, seconds in samples:
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            continue
        x = features.vector()
        w = 1.0 / (seconds * seconds)
        for i in range(d):
            moment[i] += w * x[i] * seconds
            for j in range(d):
                gram[i][j] += w * x[i] * x[j]
        used += 1
    if used == 0:
        raise ValueError("no usable step samples to fit (need positive, finite seconds)")
    # The ridge of each coefficient is relative to its own data (a feature the samples do
    # exercise is barely pulled; one they never exercise sits at the prior).
    scale = max(gram[i][i] for i in range(d))
    ridge = [prior_strength * (gram[i][i] if gram[i][i] > 0 else scale) for i in range(d)]
    matrix = [[gram[i][j] + (ridge[i] if i == j else 0.0) for j in range(d)] for i in range(d)]
    rhs = [moment[i] + ridge[i] * prior_scaled[i] for i in range(d)]
    theta = _solve_nonnegative(matrix, rhs)
    return StepCostCoefficients(*(max(0.0, t) / s for t, s in zip(theta, _FEATURE_SCALES)))


# Lone chunks shorter than this stay out of the per-token curve: the prefill floor's chunks are
# longer, and on CPU chunks of <= 32 tokens run through the fused decode stack, a path that is
# 10% cheaper per token than the one the floor's chunks take.
CURVE_MIN_TOKENS = 64


def token_cost_at(curve: tuple[tuple[int, float], ...], chunk_tokens: int, default: float) -> float:
    """Seconds per prompt token of a chunk of `chunk_tokens` on a (size, seconds per token)
    curve: interpolated in log size, clamped to its ends; `default` for an empty curve."""
    if not curve:
        return default
    # A larger chunk never costs more per token than a smaller one: a size that measured
    # dearer than a smaller one takes the smaller one's cost. (Noise in the profile's largest
    # chunk then errs toward a cheap whole prompt, so toward fewer chunks; the other way round,
    # one slow 1024-token sample had made every size as dear and chunking look free: 33
    # chunks, 1.15x eager.)
    curve = tuple((n, min(c for m, c in curve if m <= n)) for n, _ in curve)
    if chunk_tokens <= curve[0][0]:
        return curve[0][1]
    for (n0, c0), (n1, c1) in zip(curve, curve[1:]):
        if chunk_tokens <= n1:
            w = math.log(chunk_tokens / n0) / math.log(n1 / n0)
            return c0 + w * (c1 - c0)
    return curve[-1][1]


def prompt_token_curve(samples: list[tuple[StepFeatures, float]], predict) -> tuple[tuple[int, float], ...]:
    """(chunk tokens, seconds per token) from the samples that are one prompt chunk from
    position 0 and nothing else: the step's time less what the fit gives its other features
    (fixed costs, attention), per token; the median where a size was timed more than once."""
    by_size: dict[int, list[float]] = {}
    for features, seconds in samples:
        n = features.prefill_tokens
        if (n < CURVE_MIN_TOKENS or features.decode_tokens or features.context_pairs
                or not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0)):
            continue
        others = predict(StepFeatures(attention_pairs=features.attention_pairs, prompt_step=features.prompt_step))
        per_token = (seconds - others) / n
        if per_token > 0:
            by_size.setdefault(n, []).append(per_token)
    return tuple((n, sorted(v)[len(v) // 2]) for n, v in sorted(by_size.items()))


def _solve_nonnegative(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Minimize x^T M x - 2 x^T rhs subject to x >= 0 (active set: fix the most negative
    coefficient at 0 and solve again). Clamping negatives after an unconstrained solve would
    be wrong when features are nearly collinear (a step's base cost against its decode count
    when the batch size barely varies): a negative base with an inflated per-decode cost fits
    the data, but clamping only the base then predicts steps several times too long."""
    free = list(range(len(rhs)))
    while True:
        sub = [[matrix[i][j] for j in free] for i in free]
        solution = _solve_spd(sub, [rhs[i] for i in free])
        theta = [0.0] * len(rhs)
        for i, value in zip(free, solution):
            theta[i] = value
        negative = [i for i in free if theta[i] < 0]
        if not negative:
            return theta
        free.remove(min(negative, key=lambda i: theta[i]))


def _solve_spd(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Solve M x = rhs for a symmetric positive definite M by Cholesky (M = L L^T).

    Runs every engine step (the slo policy's observe_step refits its model), so the dot
    products are sum(map(mul, ...)) over rows of L kept as ragged lists (row i holds L[i][0..i],
    map stops at the shorter operand): the same products added in the same order as the
    textbook loops, at a fraction of a generator's interpreter cost."""
    n = len(rhs)
    lower: list[list[float]] = []
    for i in range(n):
        row = matrix[i]
        li: list[float] = []
        for j in range(i):  # li holds L[i][0..j-1] here, lower[j] L[j][0..j]
            lj = lower[j]
            li.append((row[j] - sum(map(mul, li, lj))) / lj[j])
        # The ridge term keeps M positive definite; max() guards rounding only.
        li.append(math.sqrt(max(row[i] - sum(map(mul, li, li)), 1e-300)))
        lower.append(li)
    y: list[float] = []
    for i in range(n):  # L y = rhs
        li = lower[i]
        y.append((rhs[i] - sum(map(mul, li, y))) / li[i])
    x = [0.0] * n
    for i in reversed(range(n)):  # L^T x = y
        column = [lower[k][i] for k in range(i + 1, n)]
        x[i] = (y[i] - sum(map(mul, column, x[i + 1:]))) / lower[i][i]
    return x
