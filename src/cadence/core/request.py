"""A request's scheduling state: its tokens and the counters that say how far it got.

Counters are the truth: `num_tokens` = prompt + generated tokens, and `num_computed_tokens` (the
positions whose KV is in the cache) catches up to it step by step. Everything else is derived.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from cadence.core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    # Blocks freed to make room for others; back in the waiting queue, to be recomputed.
    PREEMPTED = "preempted"
    # Prompt prefilled by another engine; blocks allocated, its KV being loaded (remote_kv.py).
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason ("stop" | "length" | "abort" | "error"), None if unfinished."""
        return _FINISH_REASONS.get(self)

    @staticmethod
    def from_finish_reason(reason: str) -> RequestStatus:
        for status, name in _FINISH_REASONS.items():
            if name == reason:
                return status
        raise ValueError(
            f"unknown finish reason {reason!r}; expected one of {sorted(_FINISH_REASONS.values())}"
        )


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """One generation request as the scheduler sees it (token ids only, no text)."""

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        if not isinstance(req_id, str) or not req_id:
            raise ValueError(f"req_id must be a non-empty str, got {req_id!r}")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"request {req_id}: cache_salt must be a non-empty string")
        prompt = tuple(prompt_token_ids)
        if not prompt:
            raise ValueError(f"request {req_id}: prompt_token_ids must not be empty")
        for tok in prompt:
            if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                raise ValueError(f"request {req_id}: token ids must be ints >= 0, got {tok!r}")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"request {req_id}: sampling must be SamplingParams")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"request {req_id}: priority must be an int, got {priority!r}")
        self.req_id = req_id
        self.prompt_token_ids: tuple[int, ...] = prompt
        self.sampling = sampling
        self.arrival_time = float(arrival_time)
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        # Human-readable cause when finish_reason == "error" (e.g. the pool is too small).
        self.error_message: str | None = None
        self.output_token_ids: list[int] = []
        # prompt + output, kept as one list so chunks can slice it without concatenating.
        self._all_token_ids: list[int] = list(prompt)
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at first admission (-1 = not yet admitted).
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # Prefill side of a disaggregated request: on a normal finish its blocks are leased
        # (kept for the decode side to pull) instead of freed.
        self.hold_kv_on_finish = False
        # Chained hashes of the full blocks of all_token_ids, extended lazily by the KV manager;
        # vLLM's cache_salt keys them apart from other tenants' (core/block_hash.py).
        self.cache_salt = cache_salt
        self.block_hashes: list[bytes] = []

    # -- derived counters -------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def all_token_ids(self) -> Sequence[int]:
        """prompt + output tokens (a read-only view by convention: do not mutate)."""
        return self._all_token_ids

    @property
    def num_remaining_tokens(self) -> int:
        """Known tokens whose KV is not computed yet (1 for a plain decode)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def is_prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def takes_prefix_hits(self) -> bool:
        """Whether cached prefix blocks may stand in for computing its prompt: not when it
        asks for prompt logprobs, whose every position needs its logits (vLLM V1 skips the
        prefix cache for such requests too). Its own blocks still enter the cache."""
        return self.sampling.prompt_logprobs is None

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling.max_tokens

    # -- mutations (the scheduler calls these) ----------------------------------------------
    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def set_finished(self, status: RequestStatus, message: str | None = None) -> None:
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        self.status = status
        self.finish_reason = status.finish_reason
        self.error_message = message

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.value}, "
            f"prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens}, "
            f"priority={self.priority})"
        )
