"""What the offline `LLM` returns, shaped as vLLM's outputs so vLLM code reads it unchanged.

    out = llm.generate(prompts, sampling_params)[0]
    out.prompt, out.prompt_token_ids, out.outputs[0].text, out.outputs[0].token_ids,
    out.outputs[0].finish_reason, out.outputs[0].stop_reason, out.outputs[0].logprobs

cadence adds its per-request telemetry (`timeline`: queue, prefill and decode times, token
times) and `error` (why, when finish_reason == "error").
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.core.plan import SampledToken
from cadence.telemetry.request_timeline import RequestTimeline


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability as vLLM reports it: `rank` is 1 for the most likely token
    (counted among the alternatives returned; a sampled token outside them ranks after them),
    `decoded_token` its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(frozen=True)
class RequestMetrics:
    """vLLM's RequestOutput.metrics, from cadence's timeline (time.monotonic() seconds)."""

    arrival_time: float
    last_token_time: float | None
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None
    num_preemptions: int = 0

    @classmethod
    def from_timeline(cls, t: RequestTimeline) -> RequestMetrics:
        return cls(arrival_time=t.arrival_time,
                   last_token_time=t.token_times[-1] if t.token_times else None,
                   first_scheduled_time=t.first_scheduled_time,
                   first_token_time=t.first_token_time, time_in_queue=t.queue_time,
                   finished_time=t.finished_time, num_preemptions=t.num_preemptions)


@dataclass(frozen=True)
class CompletionOutput:
    """One of the `n` completions of a prompt (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    # Sum of the sampled tokens' logprobs, when logprobs were asked for.
    cumulative_logprob: float | None
    # One dict per output token: {token_id: Logprob} with the sampled token and its top
    # alternatives (vLLM's shape).
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    timeline: RequestTimeline | None = None
    error: str | None = None
    # The raw SampledToken entries (token_id, logprob, top_logprobs) behind `logprobs`.
    sampled: tuple[SampledToken, ...] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's results (vLLM's RequestOutput), in the order the prompts were given."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    # SamplingParams.prompt_logprobs: one entry per prompt token, None for the first, then
    # {token_id: Logprob} holding the prompt token (its rank in the whole vocabulary) and the
    # top prompt_logprobs alternatives (vLLM's shape).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0
    # cadence's telemetry of completion 0 (each completion carries its own too).
    timeline: RequestTimeline | None = None

    @property
    def metrics(self) -> RequestMetrics | None:
        """vLLM's per-request times (arrival, queue, first token, finish)."""
        return None if self.timeline is None else RequestMetrics.from_timeline(self.timeline)
