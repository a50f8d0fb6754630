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
class CompletionOutput:
    """One of the `n` completions of a prompt (vLLM's CompletionOutput)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    # Sum of the sampled tokens' logprobs, when logprobs were asked for.
    cumulative_logprob: float | None
    # One dict per output token: {token_id: logprob} with the sampled token and its top
    # alternatives (vLLM's shape, without the Logprob wrapper: plain floats).
    logprobs: list[dict[int, float]] | None
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
    prompt_logprobs: list[dict[int, float] | None] | None = None
    num_cached_tokens: int = 0
    # cadence's telemetry of completion 0 (each completion carries its own too).
    timeline: RequestTimeline | None = None
