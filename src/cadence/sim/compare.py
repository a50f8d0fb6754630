"""The policy comparison: eager, chunked at several budgets, slo at several ITL targets, each
over the same workload and cost model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.sim.cost_model import CostModel
from cadence.sim.metrics import SimSummary, summarize
from cadence.sim.simulator import simulate
from cadence.sim.step_jitter import StepJitter
from cadence.sim.workload import Workload


def policy_variants(
    budgets: Sequence[int] = (128, 256, 512, 1024),
    targets_ms: Sequence[float] = (25.0, 50.0, 100.0, 200.0),
    eager_budget: int = 512,
    slo_budget: int = 2048,
    base: SchedulerConfig | None = None,
) -> list[SchedulerConfig]:
    """Scheduler configs to compare. slo gets a large budget so the target, not the budget,
    is what sizes its chunks."""
    base = base or SchedulerConfig()
    configs = [dataclasses.replace(base, policy="eager", max_num_batched_tokens=eager_budget)]
    configs += [
        dataclasses.replace(base, policy="chunked", max_num_batched_tokens=b) for b in budgets
    ]
    configs += [
        dataclasses.replace(
            base, policy="slo", max_num_batched_tokens=slo_budget, target_itl_ms=float(t)
        )
        for t in targets_ms
    ]
    if targets_ms:
        # --policy adaptive: colocated slo steps at the base config's target, or prefill and
        # decode side by side on split cores, chosen per interval.
        configs.append(dataclasses.replace(base, policy="adaptive",
                                           max_num_batched_tokens=slo_budget, core_split="auto"))
    return configs


def run_comparison(
    workload: Workload,
    cost_model: CostModel,
    configs: Iterable[SchedulerConfig],
    cache: CacheConfig | None = None,
    calibration: list | None = None,
    jitter: StepJitter | None = None,
    num_cores: int = 2,
    contention=None,
) -> list[SimSummary]:
    """Each config over the workload. `calibration`: the profile samples the scheduler starts
    from (as an engine's startup profile); `jitter`: step times drawn from a host's spread,
    each config from the same seed; `num_cores` and `contention` (core/contention.py; None:
    this machine's cached measurement) for the configs that split cores."""
    return [summarize(simulate(workload, cfg, cost_model, cache, calibration=calibration,
                               jitter=jitter.reseeded(jitter.seed) if jitter else None,
                               num_cores=num_cores, contention=contention))
            for cfg in configs]
