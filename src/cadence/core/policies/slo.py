"""SLO-driven chunked prefill: decodes first, then prompt chunks sized to an ITL target.

Every step that carries a decode is a gap in some stream, so its duration is an inter-token
latency. This policy serves running decodes first (as `chunked`), then gives prompt chunks only
as many tokens as keep the step's *predicted* time within `target_itl_ms`. The prediction comes
from an online StepCostModel that the engine feeds with each step's measured executor time
(`Scheduler.observe_step`), so the chunk size follows the hardware and the context length: a
late chunk of a long document (more attention per token) gets fewer tokens than an early one.

The prediction is inflated by the model's running relative error (capped at 50%) before it is
compared with the target: on a noisy machine a chunk sized to the mean would overshoot in
about half the steps.

Two rules keep it live and efficient:
- at least one prompt chunk of `block_size` tokens runs per step, even when the decodes alone
  already exceed the target, so a prompt always progresses;
- with no decode in the step there is no stream to protect, and prompts get the whole token
  budget (as `chunked`).
The token budget, sequence cap and `long_prefill_token_threshold` bound every chunk as usual.
"""

from __future__ import annotations

from cadence.core.config import SchedulerConfig
from cadence.core.plan import StepPlan
from cadence.core.policies.base import Policy
from cadence.core.step_builder import ChunkRule, StepBuilder
from cadence.core.step_cost import StepCostModel, StepFeatures


# Most the ITL target is tightened by for the model's recent prediction error.
MAX_SAFETY_MARGIN = 0.5


class SLOPolicy(Policy):
    name = "slo"

    def __init__(self, config: SchedulerConfig, cost_model: StepCostModel | None = None) -> None:
        super().__init__(config)
        # Per scheduler, learned online; starts from the model's prior.
        self.cost_model = cost_model or StepCostModel()
        self.target_s = config.target_itl_ms / 1000.0

    def build(self, step: StepBuilder) -> None:
        running = step.running_by_rank()
        decodes = [r for r in running if r.num_remaining_tokens == 1]
        prefills = [r for r in running if r.num_remaining_tokens > 1]
        step.schedule_running(decodes, self.budget_chunk)
        # What made it into the step so far (a plan is a read-only snapshot of the builder).
        so_far = step.build_plan(step_id=-1)
        if all(c.is_prefill for c in so_far.chunks):
            # No stream is waiting on this step: use the whole budget.
            step.schedule_running(prefills, self.budget_chunk)
            step.admit_waiting(self.budget_chunk)
            return
        margin = 1.0 + min(self.cost_model.relative_error, MAX_SAFETY_MARGIN)
        sizer = ChunkSizer(
            self.cost_model,
            self.target_s / margin,
            StepFeatures.of_plan(so_far),
            min_chunk=so_far.block_size,
            threshold=self.config.long_prefill_token_threshold,
        )
        for request in prefills:
            step.schedule_running([request], sizer.rule_from(request.num_computed_tokens))

        def admission_rule(remaining: int, budget: int, step_is_empty: bool) -> int:
            # admit_waiting asks about the head of the queue; its chunk starts after the
            # prefix-cache hit, i.e. at num_tokens - remaining.
            head = step.peek_waiting()
            start = head.num_tokens - remaining if head is not None else 0
            return sizer.size(start, remaining, budget)

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
        """Learn from a measured step (called by Scheduler.observe_step)."""
        self.cost_model.observe_plan(plan, duration_s)


class ChunkSizer:
    """Sizes the prompt chunks of one step so that its predicted time stays within a target.

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
    ) -> None:
        self.cost_model = cost_model
        self.target_s = target_s
        self.features = base
        self.min_chunk = max(1, min_chunk)
        self.threshold = threshold
        self.granted_any = False

    def rule_from(self, start: int) -> ChunkRule:
        """A ChunkRule for one request whose next chunk starts at position `start`."""

        def rule(remaining: int, budget: int, step_is_empty: bool) -> int:
            return self.size(start, remaining, budget)

        return rule

    def size(self, start: int, remaining: int, budget: int) -> int:
        """Tokens for a chunk from `start` (the request needs `remaining`, the step has
        `budget` left); 0 means not this step."""
        cap = min(remaining, budget)
        if self.threshold > 0:
            cap = min(cap, self.threshold)
        if cap <= 0:
            return 0
        fits = self._largest_fitting(start, cap)
        if fits == cap or fits >= self.min_chunk:
            num_new = fits
        elif not self.granted_any:
            num_new = min(cap, self.min_chunk)  # progress: one block per step at least
        else:
            num_new = 0  # a sliver under one block is not worth its own chunk
        if num_new > 0:
            self.features = self.features + StepFeatures.of_chunk(start, num_new)
            self.granted_any = True
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
