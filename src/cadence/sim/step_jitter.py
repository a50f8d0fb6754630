"""How much a host's step times vary, as multiplicative noise on simulated steps.

A cost model prices a step at what a profile measured *typically* (medians). A shared host
runs the same step 5-50% slower now and then (a neighbour's burst, a slow stretch of a few
seconds), and two metrics the simulator is asked for are made of exactly those excursions:
p99 ITL is the worst few stalls of a run (a max over a handful of prompt steps), and a mean
TTFT is a sum of step times, whose mean sits above the steps' median when the spread is
skewed to the slow side. A deterministic simulation of median steps came out 4-5% below the
real engine on both, on average over the validation's pairs (Zen 4, `cadence sim --validate`),
in the direction of the skew.

`StepJitter` draws each simulated step's factor from the spread the profile itself measured:
every round of every shape divided by that shape's median, pooled separately for steps the
fused stack takes (a few ms, dominated by fixed costs) and for prompt steps. Seeded, so a
simulation stays reproducible; `cadence sim --validate` takes the median over a few seeds.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

from cadence.core.plan import StepPlan
from cadence.core.step_cost import StepFeatures

# Fewer ratios than this in a class and its spread is not known: that class gets none.
MIN_RATIOS = 6


class StepJitter:
    """Factors for simulated step times, drawn from measured (seconds / shape median) ratios."""

    def __init__(self, prompt_ratios: Sequence[float], stack_ratios: Sequence[float],
                 seed: int = 0) -> None:
        self.prompt_ratios = tuple(sorted(prompt_ratios))
        self.stack_ratios = tuple(sorted(stack_ratios))
        self.seed = seed
        self._rng = random.Random(seed)

    @classmethod
    def from_rounds(cls, rounds: Sequence[tuple[StepPlan, Sequence[float]]],
                    seed: int = 0) -> StepJitter | None:
        """The spread of a profile's rounds (core/step_profile.profile_step_rounds); None when
        the profile ran fewer than 3 rounds (two points give no spread around a median)."""
        prompt: list[float] = []
        stack: list[float] = []
        for plan, times in rounds:
            times = [t for t in times if t > 0]
            if len(times) < 3:
                continue
            mid = statistics.median(times)
            target = prompt if StepFeatures.of_plan(plan).prompt_step else stack
            target.extend(t / mid for t in times)
        if len(prompt) < MIN_RATIOS and len(stack) < MIN_RATIOS:
            return None
        return cls(prompt if len(prompt) >= MIN_RATIOS else (),
                   stack if len(stack) >= MIN_RATIOS else (), seed)

    def reseeded(self, seed: int) -> StepJitter:
        """The same spread with its own random stream."""
        return StepJitter(self.prompt_ratios, self.stack_ratios, seed)

    def factor(self, plan: StepPlan) -> float:
        """A factor for this step's time (1.0 where its class has no measured spread)."""
        ratios = self.prompt_ratios if StepFeatures.of_plan(plan).prompt_step else self.stack_ratios
        return self._rng.choice(ratios) if ratios else 1.0

    def describe(self) -> str:
        def spread(r: tuple[float, ...]) -> str:
            if not r:
                return "none"
            return (f"mean x{statistics.fmean(r):.3f}, p90 x{r[int(0.9 * (len(r) - 1))]:.2f}, "
                    f"max x{r[-1]:.2f} ({len(r)} rounds)")
        return f"prompt steps {spread(self.prompt_ratios)}; stack steps {spread(self.stack_ratios)}"
