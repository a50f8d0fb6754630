"""One engine step as a flat record: what ran, how long it took, how full the KV cache was."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cadence.core.plan import StepOutput, StepPlan


@dataclass(frozen=True)
class StepRecord:
    """A step's facts. Times are seconds on the engine clock (time.monotonic by default).

    t_start / t_end bracket the whole step (schedule, forward, update, detokenize);
    forward_time_s is the executor's own forward timing inside it. KV block counts are taken
    after the step's update, so they show what the next step starts from.
    """

    step_id: int
    t_start: float
    t_end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    req_ids: tuple[str, ...]
    num_blocks_used: int
    num_blocks_free: int
    num_blocks_cached: int
    num_preemptions: int
    forward_time_s: float
    num_running: int = 0
    num_waiting: int = 0
    # Who ran what (for interference attribution, cadence.telemetry.attribution): the
    # requests with a prompt chunk in this step, that chunk's tokens and the request's prompt
    # length (parallel tuples); the requests that got a token at t_end; the ones preempted.
    prefill_req_ids: tuple[str, ...] = ()
    prefill_chunk_tokens: tuple[int, ...] = ()
    prefill_prompt_tokens: tuple[int, ...] = ()
    sampled_req_ids: tuple[str, ...] = ()
    preempted_req_ids: tuple[str, ...] = ()
    num_blocks_total: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists when dumped)."""
        d = asdict(self)
        for key in ("req_ids", "prefill_req_ids", "prefill_chunk_tokens", "prefill_prompt_tokens",
                    "sampled_req_ids", "preempted_req_ids"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_step(
        cls,
        plan: StepPlan,
        out: StepOutput | None,
        t_start: float,
        t_end: float,
        stats: Any = None,
        prefill_prompt_tokens: tuple[int, ...] | None = None,
        sampled_req_ids: tuple[str, ...] = (),
    ) -> StepRecord:
        """Build from the plan, the executor's output and the scheduler's stats after update.

        `stats` is a cadence.core SchedulerStats (read by attribute; None gives zeros);
        `prefill_prompt_tokens` are the prompt lengths of the plan's prefill chunks, in order.
        """

        def stat(name: str) -> int:
            return int(getattr(stats, name, 0) or 0) if stats is not None else 0

        prefill = [c for c in plan.chunks if c.is_prefill]
        return cls(
            step_id=plan.step_id,
            t_start=t_start,
            t_end=t_end,
            num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_tokens=plan.num_decode_tokens,
            num_seqs=len(plan.chunks),
            req_ids=tuple(c.req_id for c in plan.chunks),
            num_blocks_used=stat("num_blocks_used"),
            num_blocks_free=stat("num_blocks_free"),
            num_blocks_cached=stat("num_blocks_cached"),
            num_preemptions=len(plan.preempted),
            forward_time_s=out.forward_time_s if out is not None else 0.0,
            num_running=stat("num_running"),
            num_waiting=stat("num_waiting"),
            prefill_req_ids=tuple(c.req_id for c in prefill),
            prefill_chunk_tokens=tuple(c.num_new_tokens for c in prefill),
            prefill_prompt_tokens=(tuple(prefill_prompt_tokens) if prefill_prompt_tokens is not None
                                   else (0,) * len(prefill)),
            sampled_req_ids=tuple(sampled_req_ids),
            preempted_req_ids=tuple(plan.preempted),
            num_blocks_total=stat("num_blocks_total"),
        )
