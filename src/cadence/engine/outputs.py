"""What the engine hands its callers: plain records (read-only by convention), safe to send between processes."""

from __future__ import annotations

from dataclasses import dataclass

from cadence.core.plan import SampledToken


@dataclass(slots=True)  # per request per step: see ScheduledChunk (core/plan.py)
class RequestOutput:
    """One request's progress in one engine step (a delta, not the whole history).

    new_text is the text completed by this step's tokens, after stop-string handling: text that
    may begin a stop string is held back until resolved, and a matched stop string (and anything
    after it) never appears. logprobs, when the request asked for them, has one SampledToken per
    entry of new_token_ids (its logprob and top alternatives). error says why, when
    finish_reason == "error".
    """

    req_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    logprobs: tuple[SampledToken, ...] | None = None
    error: str | None = None
    # Disaggregation: the prefill side's handoff (engine id, address, block ids, first token)
    # or the decode side's transfer record (bytes, seconds); None otherwise.
    kv_transfer_params: dict | None = None
    # vLLM's stop_reason: the stop string or stop_token_ids entry that ended the request (None
    # for EOS, length and everything else).
    stop_reason: str | int | None = None
    # Prompt logprobs (sampling.prompt_logprobs set), once, on the output with the first
    # token: one entry per prompt token, the first with logprob None (nothing predicts it),
    # each other with its logprob, rank and top alternatives.
    prompt_logprobs: tuple[SampledToken, ...] | None = None
