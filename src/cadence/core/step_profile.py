"""A short profile of this machine: time a few synthetic steps on the real executor.

The slo policy sizes prompt chunks with a step-time model (core/step_cost.py). Its built-in
prior is a roofline of one machine; on another one (float32 on AVX2, a GPU, a busier host) the
first document's chunks would be sized by wrong numbers until the online fit caught up. So the
engine runs this profile once at start (about a dozen steps: decode batches, prompt chunks of
a few sizes, early and late in a context, alone and with decodes riding along) and hands the
(plan, seconds) pairs to `Scheduler.calibrate`, which makes the fit this machine's prior. The
same samples calibrate the simulator (`cadence sim --calibrate`).

The profile is sized by the model's cost (`scaled_shapes`): one probe step estimates what the
whole profile would take, and where that is over `PROFILE_BUDGET_S` the large chunks, their
positions and the decodes' contexts shrink by halves (never below 64 tokens, the per-token
curve's smallest size; positions and contexts stay) and then the rounds drop to one. SmolLM2 on 2 cores keeps the full
profile (~10 s); the 8B shape on 2 cores, where the full profile's ~5600 prompt tokens took
minutes, profiles an eighth of the sizes in one round.

Pure Python (the executor is a callable), so the simulator can rebuild the same plans from a
saved profile. The synthetic steps write KV into blocks that no request owns yet (the pool is untouched, no
prefix hash is registered), so nothing a real request reads is affected.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from cadence.core.plan import ScheduledChunk, StepOutput, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.core.step_cost import StepFeatures

logger = logging.getLogger(__name__)

# A token id that every vocabulary has.
_TOKEN = 1
_GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class ProfileShape:
    """One synthetic step: `decodes` sequences decoding at context `decode_ctx`, plus (when
    `chunk` > 0) one prompt chunk of `chunk` tokens starting at `chunk_start`."""

    decodes: int = 0
    decode_ctx: int = 64
    chunk: int = 0
    chunk_start: int = 0

    @property
    def label(self) -> str:
        parts = []
        if self.decodes:
            parts.append(f"{self.decodes} decode(s) @ctx {self.decode_ctx}")
        if self.chunk:
            parts.append(f"chunk {self.chunk} @pos {self.chunk_start}")
        return " + ".join(parts) or "empty"


# Enough variety to pin down the step model's coefficients (fixed cost, per prompt token, per
# decode token, per attention pair, a step carrying a prompt chunk: continuing chunks at three
# positions) and the per-token cost by chunk size (lone chunks of 256, 512 and 1024 tokens),
# in two rounds of ~10 s for SmolLM2 on a slow 2-core CPU.
DEFAULT_SHAPES: tuple[ProfileShape, ...] = (
    ProfileShape(decodes=1),
    ProfileShape(decodes=4),
    # 8 rows at two contexts: with only the long one, the fit could not tell a row's GEMM cost
    # from its attention (on Zen 4's int4 stack it put 8 rows' cost on the attention pairs, 4.4
    # us each, and priced every decode step at context 100-300 25-30% high).
    ProfileShape(decodes=8),
    ProfileShape(decodes=8, decode_ctx=256),
    ProfileShape(chunk=32),
    # The smallest chunk the per-op path takes (FUSED_STEP_MAX_CHUNK): its fixed cost, next to
    # the 32-token chunk that rides in the fused stack.
    ProfileShape(chunk=48),
    ProfileShape(chunk=256),
    # Decodes riding with a chunk, 2, 4 and 8 of them: with 4 in each, a decode row's cost in a
    # per-op step could not be told from the step's fixed cost (the simulator's fit of such
    # steps charged 7-8 ms per decode row on Zen 4).
    ProfileShape(decodes=2, chunk=128),
    ProfileShape(decodes=4, chunk=64, chunk_start=512),
    ProfileShape(chunk=128, chunk_start=768),
    ProfileShape(decodes=8, chunk=96, chunk_start=1408),
    # A chunk the size of a floor-sized one from position 0: the slo floor compares chunked
    # prefills with the prompt run whole (thousands of tokens), an extrapolation that chunks
    # of <= 256 tokens pinned down poorly (the per-token cost falls with the chunk size, and
    # a chunk's own causal pairs are a visible share of its time only at this size).
    ProfileShape(chunk=512),
    # A prompt the size of the documents the floor plans for, run whole: on CPU a GEMM of a
    # thousand rows runs a fifth faster per token than the chunks of <= 256 tokens above (float32
    # GEMM vs the int8 path of small row counts on Zen 3), so a fit of chunks alone priced a
    # document run whole too high, saw chunking as nearly free and planned 33 chunks where the
    # prefill then took 1.26x its eager time.
    ProfileShape(chunk=1024),
)


def build_plan(shape: ProfileShape, block_size: int, num_blocks: int, step_id: int = 0
               ) -> StepPlan | None:
    """The synthetic plan of `shape`, or None when it needs more blocks than the cache has."""
    chunks: list[ScheduledChunk] = []
    next_block = 0

    def blocks_for(end_pos: int) -> tuple[int, ...]:
        nonlocal next_block
        n = -(-end_pos // block_size)
        table = tuple(range(next_block, next_block + n))
        next_block += n
        return table

    if shape.chunk:
        end = shape.chunk_start + shape.chunk
        chunks.append(ScheduledChunk(
            req_id="profile-chunk", token_ids=(_TOKEN,) * shape.chunk,
            start_pos=shape.chunk_start, block_table=blocks_for(end), sample=True,
            sampling=_GREEDY, output_index=0, is_prefill=True))
    for i in range(shape.decodes):
        chunks.append(ScheduledChunk(
            req_id=f"profile-decode-{i}", token_ids=(_TOKEN,), start_pos=shape.decode_ctx,
            block_table=blocks_for(shape.decode_ctx + 1), sample=True, sampling=_GREEDY,
            output_index=1, is_prefill=False))
    if next_block > num_blocks or not chunks:
        return None
    return StepPlan(step_id=step_id, chunks=tuple(chunks), block_size=block_size)


# Estimated seconds the profile may take (its warm-up and timed steps, from one probe step's
# per-token time): with it, load + profile of the 8B shape stay within ~90 s on 2 cores.
PROFILE_BUDGET_S = 20.0
# The probe: a lone chunk of this many tokens (the per-op path), run untimed then timed.
PROBE_TOKENS = 64
# Halvings of the large shapes' sizes tried before the rounds drop to one (down to 1/8).
MAX_HALVINGS = 3
# Chunks of at most this many tokens keep their size under scaling: they are the fused decode
# stack's boundary (32 rides in it, 48 takes the per-op path), not points of the per-token curve.
KEEP_CHUNKS_UP_TO = 48
# Scaled chunks stay at least this long (step_cost.CURVE_MIN_TOKENS: the curve's smallest size).
MIN_SCALED_CHUNK = 64


def scale_shape(shape: ProfileShape, halvings: int) -> ProfileShape:
    """`shape` with its large chunk divided by 2**halvings (chunks of <= KEEP_CHUNKS_UP_TO
    tokens as they are). Positions and contexts stay: they cost attention pairs only, cheap
    next to a large model's GEMMs, and they are what pins the per-pair cost; scaled with the
    chunks (an eighth of the contexts on the 8B shape) the pairs were too few to see and
    the fit charged them 0.8 ms each, 40x their cost."""
    if halvings <= 0 or shape.chunk <= KEEP_CHUNKS_UP_TO:
        return shape
    return ProfileShape(decodes=shape.decodes, decode_ctx=shape.decode_ctx,
                        chunk=max(MIN_SCALED_CHUNK, shape.chunk // 2 ** halvings),
                        chunk_start=shape.chunk_start)


def scaled_shapes(shapes: Sequence[ProfileShape], halvings: int) -> list[ProfileShape]:
    """Every shape scaled (scale_shape), duplicates dropped, order kept."""
    out: list[ProfileShape] = []
    for shape in shapes:
        scaled = scale_shape(shape, halvings)
        if scaled not in out:
            out.append(scaled)
    return out


def profile_cost_tokens(plans: Sequence[StepPlan], repeats: int) -> int:
    """Tokens the profile computes over `plans` (the warm-up on the largest step, each
    fused-stack step twice per round, every other step once per round)."""
    if not plans:
        return 0
    sizes = [p.num_prefill_tokens + p.num_decode_tokens for p in plans]
    per_round = sum(n * (1 if StepFeatures.of_plan(p).prompt_step else 2)
                    for p, n in zip(plans, sizes))
    return max(sizes) + max(1, repeats) * per_round


def profile_steps(
    execute: Callable[[StepPlan], StepOutput],
    block_size: int,
    num_blocks: int,
    max_model_len: int,
    shapes: Sequence[ProfileShape] = DEFAULT_SHAPES,
    repeats: int = 2,
    budget_s: float | None = PROFILE_BUDGET_S,
) -> list[tuple[StepPlan, float]]:
    """Run every shape once per round, `repeats` rounds (after one untimed warm-up step);
    returns (plan, seconds) with the median of the rounds per shape (on a shared host the
    fastest run is a quiet moment the served steps rarely see; the online fit tracks the rest).

    Rounds, not a shape's repeats back to back: the prefill floor reads *ratios* between the
    shapes (a chunk's per-token cost against a larger one's), and a host whose speed drifts by
    up to 2x within a minute (a shared VM) skewed them when one shape's repeats all fell in a
    slow stretch: one startup's 512-token chunk measured 15% dearer per token than 256, and the
    floor then saw chunking as free and planned 48 chunks. With `budget_s`, the shapes and
    rounds are scaled to the model's cost first (profile_step_rounds)."""
    return round_medians(profile_step_rounds(execute, block_size, num_blocks, max_model_len,
                                             shapes, repeats, budget_s))


def round_medians(rounds: Sequence[tuple[StepPlan, Sequence[float]]]
                  ) -> list[tuple[StepPlan, float]]:
    """(plan, median seconds of its rounds) for each profiled shape."""
    return [(plan, statistics.median(times)) for plan, times in rounds]


def _plans_of(shapes: Sequence[ProfileShape], block_size: int, num_blocks: int,
              max_model_len: int) -> list[StepPlan]:
    plans = []
    for shape in shapes:
        if max(shape.decode_ctx + 1, shape.chunk_start + shape.chunk) > max_model_len:
            continue
        plan = build_plan(shape, block_size, num_blocks)
        if plan is not None:
            plans.append(plan)
    return plans


def fit_to_budget(
    execute: Callable[[StepPlan], StepOutput],
    block_size: int,
    num_blocks: int,
    max_model_len: int,
    shapes: Sequence[ProfileShape],
    repeats: int,
    budget_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[StepPlan], int, int]:
    """(plans, rounds, halvings): the largest sizes, then the most rounds, whose estimated
    time fits `budget_s`; the smallest profile when none does. The estimate is one probe
    chunk's seconds per token (its fixed cost included, so it errs long) times the tokens the
    profile computes: the profile's cost is almost all prompt tokens."""
    probe = _plans_of([ProfileShape(chunk=PROBE_TOKENS)], block_size, num_blocks, max_model_len)
    if not probe:
        return _plans_of(shapes, block_size, num_blocks, max_model_len), repeats, 0
    execute(probe[0])  # first-call costs (allocations, lazy packing) are not the model's
    t0 = clock()
    execute(probe[0])
    per_token_s = (clock() - t0) / PROBE_TOKENS
    options = [(r, h) for r in dict.fromkeys((max(1, repeats), 1)) for h in range(MAX_HALVINGS + 1)]
    for rounds, halvings in options:
        plans = _plans_of(scaled_shapes(shapes, halvings), block_size, num_blocks, max_model_len)
        if profile_cost_tokens(plans, rounds) * per_token_s <= budget_s:
            break
    estimate = profile_cost_tokens(plans, rounds) * per_token_s
    if halvings or rounds < repeats:
        logger.info("startup profile scaled to the model's cost (%.1f ms per prompt token): "
                    "sizes / %d, %d round(s), about %.0f s", per_token_s * 1e3, 2 ** halvings,
                    rounds, estimate)
    return plans, rounds, halvings


def profile_step_rounds(
    execute: Callable[[StepPlan], StepOutput],
    block_size: int,
    num_blocks: int,
    max_model_len: int,
    shapes: Sequence[ProfileShape] = DEFAULT_SHAPES,
    repeats: int = 2,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[StepPlan, list[float]]]:
    """`profile_steps` before the medians: (plan, seconds of each round) per shape. The spread
    of the rounds is how much this host's step times vary (the simulator's StepJitter).
    With `budget_s`, sizes and rounds fit the model's cost (fit_to_budget)."""
    if budget_s is not None:
        plans, repeats, _ = fit_to_budget(execute, block_size, num_blocks, max_model_len,
                                          shapes, repeats, budget_s, clock)
    else:
        plans = _plans_of(shapes, block_size, num_blocks, max_model_len)
    if not plans:
        return []
    # First-call costs (allocations, lazy packing, the first touch of a large activation
    # buffer) are not a step's cost: warm up on the largest step, which touches the most.
    execute(max(plans, key=lambda p: p.num_prefill_tokens + p.num_decode_tokens))
    # Steps the fused stack takes (a few ms) run once untimed before their timed run: served
    # decode steps come in runs of alike steps, and timed right after the round's 1024-token
    # prefill (caches full of its activations) they read 15-25% slow on Zen 4 and the
    # simulator priced every decode step that much high.
    small = [not StepFeatures.of_plan(p).prompt_step for p in plans]
    times: list[list[float]] = [[] for _ in plans]
    for _ in range(max(1, repeats)):
        for plan, shape_times, is_small in zip(plans, times, small):
            if is_small:
                execute(plan)
            t0 = clock()
            execute(plan)
            shape_times.append(clock() - t0)
    return list(zip(plans, times))


def shape_of(plan: StepPlan) -> ProfileShape:
    """The ProfileShape a synthetic plan was built from (for saving a profile)."""
    decodes = [c for c in plan.chunks if not c.is_prefill]
    chunks = [c for c in plan.chunks if c.is_prefill]
    return ProfileShape(
        decodes=len(decodes),
        decode_ctx=decodes[0].start_pos if decodes else 64,
        chunk=chunks[0].num_new_tokens if chunks else 0,
        chunk_start=chunks[0].start_pos if chunks else 0,
    )


def profile_rows(samples: Sequence[tuple[StepPlan, float]]) -> list[dict]:
    """(plan, seconds) samples as JSON rows, {shape fields..., "seconds"}: what a saved
    profile (`cadence sim --save-calibration`) and an engine's trace meta line
    (`startup_profile`) hold, so that the same steps can be rebuilt (plans_of_rows)."""
    return [{**asdict(shape_of(plan)), "seconds": seconds} for plan, seconds in samples]


def plans_of_rows(rows: Sequence[dict], block_size: int) -> list[tuple[StepPlan, float]]:
    """The (plan, seconds) samples of profile_rows' rows (fields beyond the shape and
    "seconds", such as a saved profile's "rounds", are ignored); rows whose plan cannot be
    built or whose time is not positive are left out. KeyError / TypeError / ValueError on a
    malformed row."""
    fields = ProfileShape.__dataclass_fields__
    samples = []
    for row in rows:
        seconds = float(row["seconds"])
        plan = build_plan(ProfileShape(**{k: v for k, v in row.items() if k in fields}),
                          block_size, num_blocks=1 << 30)
        if plan is not None and seconds > 0:
            samples.append((plan, seconds))
    return samples
