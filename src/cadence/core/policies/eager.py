"""Eager prefill: whole prompts first, then decodes (the prefill/decode stall baseline).

Waiting requests are admitted with their whole remaining sequence in one chunk, while it fits
the token budget; running decodes get what budget is left, so a long prompt stalls every
stream that is decoding. Eager means the whole prompt in one step: a prompt longer than
`max_num_batched_tokens` (it always fits `max_model_len`, checked at add_request) is still
admitted whole, but only as the first thing in a step, which then holds that prompt alone.
That step exceeds the token budget by design; it is the only kind of step that does.
"""

from __future__ import annotations

from cadence.core.policies.base import Policy
from cadence.core.step_builder import StepBuilder


def whole_chunk(remaining: int, budget: int, step_is_empty: bool) -> int:
    """All remaining tokens, or nothing this step."""
    return remaining if remaining <= budget or step_is_empty else 0


class EagerPolicy(Policy):
    name = "eager"

    def build(self, step: StepBuilder) -> None:
        # Keep the blocks the running decodes need: admitting a prompt only to preempt it
        # again in the same step would be churn.
        step.admit_waiting(whole_chunk, reserve_for_running=True)
        step.schedule_running(step.running_by_rank(), whole_chunk)
