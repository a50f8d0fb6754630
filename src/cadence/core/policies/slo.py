"""SLO-driven chunked prefill: decodes first, then prompt chunks sized to an ITL target, but
never so small that prompts starve.

Every step that carries a decode is a gap in some stream, so its duration is an inter-token
latency. This policy serves running decodes first (as `chunked`), then gives prompt chunks as
many tokens as keep the step's *predicted* time within `target_itl_ms`. The prediction comes
from an online StepCostModel that the engine feeds with each step's measured executor time
(`Scheduler.observe_step`, seeded by a short profile at engine start), so the chunk size follows
the machine and the context length: a late chunk of a long document (more attention per token)
gets fewer tokens than an early one.

The floor (why the target alone degenerates): a step has a fixed cost F (the weights pass,
framework overhead, the decode rows riding along, and on CPU the per-op path that any prompt
chunk takes instead of the fused decode stack) that a prompt pays once per chunk. Run whole,
a prompt of work W costs F + W; in k chunks it costs k F + W. Where the target is below F (a
slow machine, many streams), target-sized chunks shrink to a block and the prompt's prefill
takes many times longer than eager. So each step's first prompt chunk is at least the smallest
n whose own work covers the step's fixed cost `1 / (max_prefill_slowdown - 1)` times over
(F <= 0.15 W(n) for 1.15): summed over chunks, k F <= 0.15 W + F, i.e. the prefill finishes
within `max_prefill_slowdown` times its eager time (under the model). The remaining prompt is
split into equal chunks of at least that size, so no chunk is a sliver. The step time that the
floor forces is the *reachable* ITL target on this machine with this many streams; the policy
reports it (`reachable_itl_s`: a running mean of the measured times of the mixed steps the
floor sized) when it exceeds the configured target.

The prediction is inflated by the model's running relative error (capped at 50%) before it is
compared with the target: on a noisy machine a chunk sized to the mean would overshoot in
about half the steps. The floor uses the mean prediction (its bound is on a sum of chunks).

With no decode in the step there is no stream to protect, and prompts get the whole token
budget (as `chunked`). The token budget, sequence cap and `long_prefill_token_threshold` bound
every chunk as usual.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from cadence.core.config import SchedulerConfig
from cadence.core.plan import StepPlan
from cadence.core.policies.base import Policy
from cadence.core.policies.partial_prefill import PartialPrefills
from cadence.core.step_builder import ChunkRule, StepBuilder
from cadence.core.step_cost import StepCostModel, StepFeatures

logger = logging.getLogger(__name__)

# Most the ITL target is tightened by for the model's recent prediction error.
MAX_SAFETY_MARGIN = 0.5
# The floor plans a prompt's chunks to the allowed slowdown less the profile fit's relative
# error (headroom, so that the bound holds in the run rather than on average), but to at least
# this share of it. On the Zen 3 host the profile's fit is off by 5-7% on a calm machine and the
# plan's predicted slowdown of a 2000-token document fell short of the measured one by 0.02-0.05
# at 5-10 chunks; planned to the whole 15%, the flat end of the per-token curve (chunks of 500
# tokens cost nearly what the whole prompt does per token) let noise swing the plan between 9
# and 22 chunks, to 6-8 with the headroom.
MIN_PLAN_SHARE_OF_SLOWDOWN = 1 / 3
# Weight of the newest mixed step in the reported reachable target (a running mean over ~10).
_REACHABLE_SMOOTHING = 0.1


class SLOPolicy(Policy):
    name = "slo"

    def __init__(self, config: SchedulerConfig, cost_model: StepCostModel | None = None) -> None:
        super().__init__(config)
        # Per scheduler, learned online; starts from the model's prior.
        self.cost_model = cost_model or StepCostModel()
        self.target_s = config.target_itl_ms / 1000.0
        # Predicted seconds of recent steps that mixed decodes with prompt chunks, when the
        # prefill floor (not the target) sized them; None while the target is reachable.
        self.reachable_itl_s: float | None = None
        self._num_reachable = 0
        self._warned_unreachable = False
        self.partial = PartialPrefills(config)
        # Whether the latest build's mixed step was sized by the floor (observe_step then
        # folds its measured time into reachable_itl_s).
        self._floor_sized_last = False
        # Per request in prefill: [chunks its prefill floor planned, chunks granted since].
        # The count is kept for the request's later chunks (their sizes follow the model):
        # re-planned at every step, the plan followed the online fit's drift between the
        # per-pair terms (chunks at later positions cannot tell them apart) and broke the
        # bound, which is a bound on the number of chunks' overheads.
        self._floor_plans: dict[str, list[int]] = {}

    def build(self, step: StepBuilder) -> None:
        running = step.running_by_rank()
        decodes = [r for r in running if r.num_remaining_tokens == 1]
        prefills = [r for r in running if r.num_remaining_tokens > 1]
        step.schedule_running(decodes, self.budget_chunk)
        self._floor_sized_last = False
        # Plans of requests no longer in prefill (done, preempted, aborted) are dropped: a
        # preempted one is planned afresh when it is admitted again.
        in_prefill = {r.req_id for r in prefills}
        self._floor_plans = {k: v for k, v in self._floor_plans.items() if k in in_prefill}
        # What made it into the step so far (a plan is a read-only snapshot of the builder).
        so_far = step.build_plan(step_id=-1)
        if all(c.is_prefill for c in so_far.chunks):
            # No stream is waiting on this step: use the whole budget.
            if self.partial.enabled:
                rule = self.budget_chunk
                self.partial.schedule(step, prefills, lambda r: rule, rule)
                return
            step.schedule_running(prefills, self.budget_chunk)
            step.admit_waiting(self.budget_chunk)
            return
        sizer = self.sizer_for(so_far)
        self.schedule_prompts(step, prefills, sizer)
        self._floor_sized_last = sizer.floor_won

    def sizer_for(self, so_far: StepPlan) -> ChunkSizer:
        """A ChunkSizer for a step that already holds `so_far` (its decodes)."""
        margin = 1.0 + min(self.cost_model.relative_error, MAX_SAFETY_MARGIN)
        return ChunkSizer(
            self.cost_model,
            self.target_s / margin,
            StepFeatures.of_plan(so_far),
            min_chunk=so_far.block_size,
            threshold=self.config.long_prefill_token_threshold,
            # The floor uses the mean prediction, no margin: the slowdown bound is on the sum
            # over a prompt's chunks, where the steps' noise averages out, while a margin
            # toward larger chunks (as this had) makes every step, and so every stream's
            # gap, longer by the same factor (1.3-1.5x under load).
            slowdown=self.config.max_prefill_slowdown,
            plans=self._floor_plans,
            stall_share=self.config.max_stall_share,
        )

    def schedule_prompts(self, step: StepBuilder, prefills: list, sizer: ChunkSizer) -> None:
        """Continue partial prefills, then admit waiting prompts, each chunk sized by `sizer`
        (short prompts first when several may be in prefill at once)."""

        def admission_rule(remaining: int, budget: int, step_is_empty: bool) -> int:
            # The request being admitted; its chunk starts after the prefix-cache hit, i.e.
            # at num_tokens - remaining.
            head = step.peek_waiting()
            start = head.num_tokens - remaining if head is not None else 0
            return sizer.size(start, remaining, budget, head.req_id if head is not None else None)

        if self.partial.enabled:
            self.partial.schedule(
                step, prefills, lambda r: sizer.rule_from(r.num_computed_tokens, r.req_id),
                admission_rule,
            )
            return
        for request in prefills:
            step.schedule_running([request],
                                  sizer.rule_from(request.num_computed_tokens, request.req_id))
        step.admit_waiting(admission_rule)

    def budget_chunk(self, remaining: int, budget: int, step_is_empty: bool) -> int:
        """As many tokens as the budget and the per-request threshold allow (chunked's rule)."""
        cap = self.config.long_prefill_token_threshold
        return min(remaining, budget, cap) if cap > 0 else min(remaining, budget)

    # -- the step-time model ----------------------------------------------------------------
    def predict_step_s(self, plan: StepPlan) -> float:
        """The model's predicted executor seconds for `plan`."""
        return self.cost_model.predict_plan(plan)

    def observe_step(self, plan: StepPlan, duration_s: float) -> None:
        """Learn from a measured step (called by Scheduler.observe_step, right after the
        build of that plan). A mixed step that the prefill floor sized is a sample of the
        ITL this machine reaches: it moves `reachable_itl_s`."""
        self.cost_model.observe_plan(plan, duration_s)
        if self._floor_sized_last and plan.num_decode_tokens and plan.num_prefill_tokens:
            self._note_reachable(duration_s)
        self._floor_sized_last = False

    def calibrate(self, samples: list[tuple[StepPlan, float]]) -> None:
        """Seed the model with a profile of this machine (Scheduler.calibrate)."""
        self.cost_model.calibrate([(StepFeatures.of_plan(p), s) for p, s in samples])

    def _note_reachable(self, measured_s: float) -> None:
        # A plain mean over the first ~10 samples, then an exponential one (a running mean
        # that starts at the first sample weighs it 0.9^k: over a document of a handful of
        # floor-sized steps it reported mostly the first one).
        self._num_reachable += 1
        if self.reachable_itl_s is None:
            self.reachable_itl_s = measured_s
        else:
            a = max(_REACHABLE_SMOOTHING, 1.0 / self._num_reachable)
            self.reachable_itl_s = (1 - a) * self.reachable_itl_s + a * measured_s
        if not self._warned_unreachable:
            self._warned_unreachable = True
            logger.info(
                "ITL target %.0f ms is below what this machine reaches without slowing "
                "prefills by more than %.0f%%: mixed steps take about %.0f ms",
                self.target_s * 1e3, (self.config.max_prefill_slowdown - 1) * 100,
                measured_s * 1e3,
            )


class ChunkSizer:
    """Sizes the prompt chunks of one step: within the target where possible, never below the
    prefill floor for the step's first chunk.

    It starts from the features of what the step already holds (the decodes) and adds each
    chunk it grants, so later chunks see the earlier ones. A chunk that a preemption undoes
    afterwards still counts, which errs on the safe (shorter) side.
    """

    def __init__(
        self,
        cost_model: StepCostModel,
        target_s: float,
        base: StepFeatures,
        min_chunk: int,
        threshold: int = 0,
        slowdown: float = float("inf"),
        plans: dict[str, list[int]] | None = None,
        stall_share: float = 0.0,
    ) -> None:
        self.cost_model = cost_model
        # Where the target is out of reach: the most of the eager step a chunk's step may take
        # (SchedulerConfig.max_stall_share; 0: the most chunks the slowdown allows).
        self.stall_share = stall_share
        self.target_s = target_s
        self.features = base
        self.min_chunk = max(1, min_chunk)
        self.threshold = threshold
        # The fixed cost each chunk's work must cover (F <= (slowdown - 1) W): W >= F / excess.
        self.excess = slowdown - 1.0
        self.granted_any = False
        # req_id -> [chunks planned, chunks granted] (SLOPolicy._floor_plans).
        self.plans = plans if plans is not None else {}
        # True when the floor, not the target, sized a chunk of this step.
        self.floor_won = False

    def rule_from(self, start: int, req_id: str | None = None) -> ChunkRule:
        """A ChunkRule for one request whose next chunk starts at position `start`."""

        def rule(remaining: int, budget: int, step_is_empty: bool) -> int:
            return self.size(start, remaining, budget, req_id)

        return rule

    def size(self, start: int, remaining: int, budget: int, req_id: str | None = None) -> int:
        """Tokens for a chunk from `start` (request `req_id` needs `remaining`, the step has
        `budget` left); 0 means not this step."""
        cap = min(remaining, budget)
        if self.threshold > 0:
            cap = min(cap, self.threshold)
        if cap <= 0:
            return 0
        fits = self._largest_fitting(start, cap)
        floor = 0 if self.granted_any else self._prefill_floor(start, remaining, cap, req_id)
        if floor > max(fits, self.min_chunk):
            num_new = floor
            self.floor_won = True
        elif fits == cap or fits >= self.min_chunk:
            num_new = fits
        elif not self.granted_any:
            num_new = min(cap, self.min_chunk)  # progress: one block per step at least
        else:
            num_new = 0  # a sliver under one block is not worth its own chunk
        if num_new > 0:
            self.features = self.features + StepFeatures.of_chunk(start, num_new)
            self.granted_any = True
            if req_id in self.plans:
                self.plans[req_id][1] += 1
        return num_new

    def _largest_fitting(self, start: int, cap: int) -> int:
        """The largest n in [0, cap] whose chunk keeps the prediction within the target
        (the prediction grows with n: the model's coefficients are clamped >= 0)."""
        lo, hi = 0, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            predicted = self.cost_model.predict(self.features + StepFeatures.of_chunk(start, mid))
            if predicted <= self.target_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _prefill_floor(self, start: int, remaining: int, cap: int,
                       req_id: str | None = None) -> int:
        """This step's chunk under the shortest step time T that keeps the prompt's chunked
        prefill within the slowdown bound; <= cap.

        The prompt (its `start + remaining` tokens, planned from position 0 at every step so
        that the plan stays one plan while the model stands still) costs U run whole in one
        step. Split into chunks that each fill a step of T seconds, it costs C(T): each step
        pays the fixed cost again (what the step holds so far, the decodes, plus carrying a
        prompt chunk at all: the per-op path on CPU), and its tokens cost what a chunk of its
        size costs per token (more than in the whole prompt's one large chunk on a
        compute-bound CPU; the profile's curve). T is the smallest with
        C(T) - U <= (excess - headroom) * (U - fixed cost): the prefill stays
        within max_prefill_slowdown times its eager time (under the model), and the steps
        take about the same time (chunks late in the prompt, with more context, are smaller),
        so the streams' largest gap is close to their typical one.

        Earlier forms broke the bound: sizing chunk by chunk (each chunk's work covers its own
        overhead) missed that a small early chunk makes every later one pay context pairs,
        and planning only the rest of the prompt at each step granted each rest a fresh
        allowance; with an extra cost per pair against cached context they came out 1.5-1.9x
        eager."""
        if not math.isfinite(self.excess):
            return 0
        plan = _ChunkPlan(self.cost_model, self.features, start + remaining, self.min_chunk)
        counts = self.plans.get(req_id) if req_id is not None else None
        if counts is None:
            # The profile's error, not the running one: the plan is made with the prior, and
            # a headroom that followed the online error made the same document's plan depend
            # on the noise of the steps before it (the simulator, whose steps match its model,
            # planned twice the chunks the engine did).
            headroom = min(self.cost_model.calibration_error,
                           self.excess * (1 - MIN_PLAN_SHARE_OF_SLOWDOWN))
            shortest_s = plan.shortest_step_s(self.excess - headroom)
            num_chunks = plan.num_chunks(0, self._stall_step_s(plan, shortest_s))
            # The shortest step fills every chunk but the last, which takes the rest: at 8
            # streams on Zen 4 a 2000-token document went 1141 + 466 + 393 tokens (800, 415,
            # 393 ms), so the streams' largest gap was 1.5x their typical one. The same number
            # of chunks in equal steps: the total is the same fixed costs and attention pairs.
            step_s = plan.step_for_chunks(0, num_chunks)
            if req_id is not None:
                self.plans[req_id] = [num_chunks, 0]
        else:
            step_s = plan.step_for_chunks(start, max(1, counts[0] - counts[1]))
        n = plan.chunk_within(start, step_s)
        if remaining - n < self.min_chunk:
            n = remaining  # a sliver would pay a whole step's fixed cost for a few tokens
        return max(min(cap, self.min_chunk), min(cap, n))


    def _stall_step_s(self, plan: _ChunkPlan, shortest_s: float) -> float:
        """The step time the floor plans a prompt's chunks to: the shortest one within the
        slowdown bound where the ITL target is within reach of it, else as long as
        `stall_share` of the prompt's eager step (never shorter than the slowdown allows).

        Why not always the shortest: once every chunk's step misses the target anyway, each
        chunk is one more gap over the target in every running stream, and the streams' tail
        under Poisson arrivals (p99 ITL) is set by how many such gaps there are: the share of
        a stream's ITLs that are stalls is about chunks per prompt x prompts per second x the
        mean ITL, so eager's one gap per document stays under the 1% where 12-22 chunks (what
        the shortest steps gave the test machine's 3000-token document) do not, and its p99
        was then a chunk's step while eager's was a plain decode step (SmolLM2, Poisson mix at
        0.5 req/s: 842 vs 59 ms). The fewest chunks that keep each gap within a fifth of the
        eager one give a burst its bound (largest gap <= 0.25x eager) in 5-6 gaps per
        document, and finish it sooner than the shortest steps do."""
        if self.target_s >= shortest_s or self.stall_share <= 0:
            return shortest_s
        return max(shortest_s, self.stall_share * plan.step_s(0, plan.length))


class _ChunkPlan:
    """The step time of one prompt chunk of n tokens from position s, next to what a step
    already holds:

        t(s, n) = fixed + p(n) n + a (n s + n (n + 1) / 2)

    (p(n) per prompt token of a chunk of n, the profile's curve; a per attention pair), and the
    plans of a prompt of `length` tokens into chunks that fill steps of T seconds."""

    def __init__(self, model: StepCostModel, held: StepFeatures, length: int,
                 min_chunk: int = 1) -> None:
        # The prior (the startup profile's fit): the plan is about the *ratio* of a step's
        # fixed cost to a token's, which the profile's designed steps (chunk sizes and
        # positions, with and without decodes) separate. The online fit's samples are mostly
        # steps of one shape (a document's equal chunks next to the same decodes), where plain
        # least squares trades fixed for per-token cost freely: on a loaded host it fitted no
        # fixed cost at all, the plan saw chunking as free and cut a 2000-token document into
        # 74 chunks of 27 tokens (1.3-1.6x its eager time).
        c = model.prior_coefficients
        self.fixed = model.predict_prior(held + StepFeatures(prompt_step=1))
        # One per-pair term: the model holds the context-pair input at 0 (StepFeatures.raw_vector).
        self.a = c.per_attention_pair_s
        # Seconds per prompt token by chunk size (the profile's curve; constant without one).
        self.p = model.prior_token_cost
        self.length = length
        # Chunks in a plan are at least this long (one block: the sizer's own minimum), which
        # also bounds a plan's walk to length / min_chunk chunks.
        self.min_chunk = max(1, min_chunk)

    def step_s(self, s: int, n: int) -> float:
        return self.fixed + self.p(n) * n + self.a * (n * s + n * (n + 1) / 2)

    def chunk_within(self, s: int, step_s: float) -> int:
        """The most tokens from position s whose step takes <= step_s (at least 1)."""
        room = step_s - self.fixed
        if room <= 0:
            return 1
        # a/2 n^2 + (p(n) + a/2 + a s) n - room <= 0, solved with p(n) held at the last
        # guess (p varies slowly with n: a few rounds settle it), then stepped to the boundary.
        n = self.length
        for _ in range(4):
            quad, lin = self.a / 2, self.p(max(1, n)) + self.a / 2 + self.a * s
            if quad > 0:
                guess = (-lin + math.sqrt(lin * lin + 4 * quad * room)) / (2 * quad)
            elif lin > 0:
                guess = room / lin
            else:
                return self.length
            guess = max(1, min(int(guess), self.length))
            if guess == n:
                break
            n = guess
        while n < self.length and self.step_s(s, n + 1) <= step_s:
            n += 1
        while n > 1 and self.step_s(s, n) > step_s:
            n -= 1
        return max(1, min(n, self.length))

    def num_chunks(self, start: int, step_s: float) -> int:
        """Chunks of steps of step_s that the prompt needs from position `start` on."""
        count, pos = 0, start
        while pos < self.length:
            pos += max(self.min_chunk, self.chunk_within(pos, step_s))
            count += 1
        return count

    def step_for_chunks(self, start: int, num_chunks: int) -> float:
        """The smallest step time that finishes the prompt from `start` in `num_chunks`."""
        return _smallest_fitting_s(self.fixed, self.step_s(start, self.length - start),
                                   lambda step_s: self.num_chunks(start, step_s) <= num_chunks)

    def chunked_s(self, step_s: float) -> float:
        """Seconds of the whole prompt in chunks that fill steps of step_s."""
        total, pos = 0.0, 0
        while pos < self.length:
            n = min(max(self.min_chunk, self.chunk_within(pos, step_s)), self.length - pos)
            total += self.step_s(pos, n)
            pos += n
        return total

    def shortest_step_s(self, excess: float) -> float:
        """The smallest step time whose chunked prompt costs at most `excess` of the whole
        prompt's own work more than running it whole (the whole prompt's step at most)."""
        whole = self.step_s(0, self.length)
        allowed = whole + excess * (whole - self.fixed)
        # chunked_s(whole) == whole (one chunk): the whole prompt's step fits.
        return _smallest_fitting_s(self.fixed, whole, lambda step_s: self.chunked_s(step_s) <= allowed)


def _smallest_fitting_s(lo: float, hi: float, fits: Callable[[float], bool]) -> float:
    """The smallest step time in (lo, hi] that `fits`, by bisection to 0.1 % of the step: `fits`
    holds at hi and, once it holds, at every longer step (more time per step, fewer chunks)."""
    for _ in range(40):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-3 * hi:
            break
    return hi
