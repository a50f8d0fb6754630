"""Several prompts in prefill at once, short ones first (vLLM's --max-num-partial-prefills,
--max-long-partial-prefills, --long-prefill-token-threshold).

With one partial prefill (the default of chunked and eager), a long document at the head of
the queue holds every prompt behind it until its last chunk: a one-line chat message waits
seconds for its first token. With more, the step serves, after the decodes:

    running short prefills -> waiting short prompts (overtaking long ones in the queue)
    -> running long prefills -> other waiting prompts, in queue order

where a prompt is long when it has more than `config.long_prompt_threshold` tokens. At most
`max_num_partial_prefills` requests are in prefill at once, at most `max_long_partial_prefills`
of them long. Running prefills continue (the caps gate admission only), except that a step
holding a short prompt's chunk leaves the long prefills out: the short prompt's first token
then waits for a step of decodes and short chunks, not for a long chunk (on a CPU a long chunk's
step is several decode steps). At most every other step, so short arrivals cannot starve a
document; the document pays one step's fixed cost per deferral.
"""

from __future__ import annotations

from collections.abc import Callable

from cadence.core.config import SchedulerConfig
from cadence.core.request import Request
from cadence.core.step_builder import ChunkRule, StepBuilder


class PartialPrefills:
    def __init__(self, config: SchedulerConfig) -> None:
        self.max_partial = config.max_num_partial_prefills
        self.max_long = config.max_long_partial_prefills
        self.threshold = config.long_prompt_threshold
        self._deferred_long_last_step = False

    @property
    def enabled(self) -> bool:
        return self.max_partial > 1

    def is_long(self, request: Request) -> bool:
        return request.num_prompt_tokens > self.threshold

    def schedule(
        self,
        step: StepBuilder,
        prefills: list[Request],
        rule_for: Callable[[Request], ChunkRule],
        admission_rule: ChunkRule,
    ) -> None:
        """Serve running prefills (`prefills`, in rank order) and admit waiting prompts, short
        ones first; `rule_for(request)` sizes a running request's chunk, `admission_rule` a
        newly admitted one's."""
        for request in [r for r in prefills if not self.is_long(r)]:
            step.schedule_running([request], rule_for(request))
        step.admit_waiting_where(
            admission_rule,
            lambda r: not self.is_long(r) and self._num_partial(step) < self.max_partial,
        )
        if self._defer_long(step, prefills):
            return
        for request in [r for r in prefills if self.is_long(r)]:
            step.schedule_running([request], rule_for(request))
        step.admit_waiting_where(admission_rule, lambda r: self._admissible(step, r))

    def _defer_long(self, step: StepBuilder, prefills: list[Request]) -> bool:
        """Whether this step leaves the long prefills out (see the module doc)."""
        short_in_step = any(not r.is_prefill_done and not self.is_long(r)
                            for r in step.scheduled_requests)
        defer = (short_in_step and not self._deferred_long_last_step
                 and any(self.is_long(r) for r in prefills))
        self._deferred_long_last_step = defer
        return defer

    def _admissible(self, step: StepBuilder, request: Request) -> bool:
        if self._num_partial(step) >= self.max_partial:
            return False
        return not self.is_long(request) or self._num_long(step) < self.max_long

    @staticmethod
    def _num_partial(step: StepBuilder) -> int:
        return sum(1 for r in step.running if not r.is_prefill_done)

    def _num_long(self, step: StepBuilder) -> int:
        return sum(1 for r in step.running if not r.is_prefill_done and self.is_long(r))
