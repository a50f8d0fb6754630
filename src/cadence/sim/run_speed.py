"""How fast a measured run's replicas computed, against the machine profile that prices the
simulated steps (sim/fleet.py's `--compare`).

The profile is taken after the benchmark, on the same host, in a tight loop of synthetic steps;
the run's engines computed the same kernels minutes earlier between their loop's other work.
On the 2-core KVM host the two differ by more than a simulator can absorb: the same profile
shapes timed 1.4x apart from one slot to the next (a neighbour's load on the host), and the
replicas' traced forwards ran 1.0-1.15x the profile's price while the other replica idled and
1.16-1.33x while it computed too (docs/performance.md#replicas-and-routing). So the steps the
replicas traced (benchmarks/replica_bench.py `step_sample`: each step's forward time, its plan's
cost features, and the share of it another replica computed) are priced by the profile's cost
model, and their median ratio gives: `alone` (the host's pace during the run: the factor the
simulated steps take) and `together` (steps beside another replica's), from which the co-run
factor beyond the core share follows (HostCpu.corun_slowdown), both from the steps the fused
stack takes (decodes: thousands per run); and `prompt_together`, the same ratio for steps that
carry a prompt chunk (the per-op path), which the profile prices off by another factor than
the decodes: in four runs of the 2-replica RAG chat prompt steps ran 0.83-1.09x the decodes'
ratio beside the other replica, and a decode pace applied to them made cache-aware's TTFT, all
prompt steps, come out 15-40% long (docs/performance.md#replicas-and-routing). So prompt steps
take `prompt_pace` (the decodes' pace times that relative factor). Step times are the inputs;
the TTFTs the simulation is checked against are not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cadence.core.plan import StepPlan
from cadence.core.step_cost import StepFeatures
from cadence.sim.host_cpu import HostCpu

# A step counts as alone / beside another replica's when at most / at least this share of it
# overlapped another replica's steps.
ALONE_SHARE, TOGETHER_SHARE = 0.1, 0.9
MIN_STEPS = 20


@dataclass(frozen=True)
class RunSpeed:
    alone: float  # median traced forward / profile price of fused-stack steps, alone
    together: float  # the same, another replica computing throughout
    steps_alone: int
    steps_together: int
    # Median ratio of prompt (per-op) steps beside another replica's; None with too few.
    prompt_together: float | None = None

    @property
    def prompt_pace(self) -> float:
        """The pace of steps that carry a prompt chunk: the decodes' pace times how much
        slower (or faster) than the decodes, against the profile's price, prompt steps ran
        where both ran beside the other replica (few prompt steps run alone)."""
        if self.prompt_together is None:
            return self.alone
        return self.alone * self.prompt_together / self.together

    def corun_slowdown(self, host: HostCpu) -> float:
        """The factor a step beside another replica takes beyond what sharing the cores with
        the stack explains (host.rate with two replicas busy), for fleets with a core per
        replica, so that the simulated steps beside each other run as the traced ones did.
        Below 1 where they ran faster than processor sharing gives them (the stack's CPU fell
        mostly between the engines' steps: 0.88-0.93 in two of three runs)."""
        return self.together / self.alone * host.rate(2, 0)


def measure_run_speed(sample: list[list[float]], cost_model) -> RunSpeed | None:
    """RunSpeed of a row's `step_sample` priced by `cost_model` (a LinearCostModel: its
    features_time, without engine overhead). None without enough steps of either kind or with a
    cost model that prices plans only."""
    price = getattr(cost_model, "features_time", None)
    if price is None or not sample:
        return None
    alone, together, prompt_together = [], [], []
    for forward, prefill, decode, pairs, per_op, seqs, overlap in sample:
        features = StepFeatures(prefill_tokens=int(prefill), decode_tokens=int(decode),
                                attention_pairs=int(pairs), prompt_step=int(per_op))
        predicted = price(features, int(seqs))
        if predicted <= 0 or forward <= 0:
            continue
        if per_op:
            if overlap >= TOGETHER_SHARE:
                prompt_together.append(forward / predicted)
        elif overlap <= ALONE_SHARE:
            alone.append(forward / predicted)
        elif overlap >= TOGETHER_SHARE:
            together.append(forward / predicted)
    if len(alone) < MIN_STEPS or len(together) < MIN_STEPS:
        return None
    return RunSpeed(statistics.median(alone), statistics.median(together), len(alone),
                    len(together), statistics.median(prompt_together)
                    if len(prompt_together) >= MIN_STEPS else None)


class PacedCostModel:
    """A cost model's step at the run's pace: its seconds times `pace` (`prompt_pace` for a
    step that carries a prompt chunk on the per-op path), plus the engine loop's measured work
    per step beyond the forward (`overhead_s`, not scaled: measured in the run)."""

    def __init__(self, base, pace: float, overhead_s: float,
                 prompt_pace: float | None = None) -> None:
        self.base, self.pace, self.overhead_s = base, pace, overhead_s
        self.prompt_pace = pace if prompt_pace is None else prompt_pace
        self.name = (f"{base.name} x{pace:.2f} (the run's pace; prompt steps "
                     f"x{self.prompt_pace:.2f}) + {overhead_s * 1e3:.1f} ms/step")

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        pace = self.prompt_pace if StepFeatures.of_plan(plan).prompt_step else self.pace
        return self.base.step_time(plan) * pace + self.overhead_s
