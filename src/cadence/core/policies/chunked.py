"""Chunked prefill: running decodes first, then prompt chunks fill the rest of the budget.

Decodes (one token each) go first so streams never stall; then requests already part-way
through their prompt continue; then waiting requests are admitted with a chunk of what budget
is left. `long_prefill_token_threshold` (> 0) caps one request's chunk so that a single long
prompt cannot take the whole budget of a step.
"""

from __future__ import annotations

from cadence.core.config import SchedulerConfig
from cadence.core.policies.base import Policy
from cadence.core.policies.partial_prefill import PartialPrefills
from cadence.core.step_builder import StepBuilder


class ChunkedPolicy(Policy):
    name = "chunked"

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.partial = PartialPrefills(config)

    def build(self, step: StepBuilder) -> None:
        running = step.running_by_rank()
        decodes = [r for r in running if r.num_remaining_tokens == 1]
        prefills = [r for r in running if r.num_remaining_tokens > 1]
        step.schedule_running(decodes, self.chunk)
        if self.partial.enabled:  # several prompts at once, short ones first
            self.partial.schedule(step, prefills, lambda r: self.chunk, self.chunk)
            return
        step.schedule_running(prefills, self.chunk)
        step.admit_waiting(self.chunk)

    def chunk(self, remaining: int, budget: int, step_is_empty: bool) -> int:
        """As many tokens as the budget and the per-request threshold allow."""
        cap = self.config.long_prefill_token_threshold
        return min(remaining, budget, cap) if cap > 0 else min(remaining, budget)
