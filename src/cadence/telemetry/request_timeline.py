"""A request's life in timestamps, and the latency metrics derived from them (DESIGN.md).

Formulas (server side, all on the engine clock):
- queue_time   = first_scheduled - arrival
- prefill_time = first_token - first_scheduled
- ttft         = first_token - arrival
- itl          = gaps between consecutive output tokens, the first token excluded; a step emits
                 one token per request, so each token has its own time and no zeros are added
- tpot         = (e2e - ttft) / (num_output_tokens - 1)
- e2e          = finished - arrival
- decode_time  = finished - first_token
A metric whose events have not happened (yet) is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestTimeline:
    """Filled in by the TelemetryRecorder as the request moves; read-only once finished."""

    req_id: str
    arrival_time: float
    num_prompt_tokens: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    finish_reason: str | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finished_time is not None

    @property
    def queue_time(self) -> float | None:
        return _diff(self.first_scheduled_time, self.arrival_time)

    @property
    def prefill_time(self) -> float | None:
        return _diff(self.first_token_time, self.first_scheduled_time)

    @property
    def ttft(self) -> float | None:
        return _diff(self.first_token_time, self.arrival_time)

    @property
    def e2e(self) -> float | None:
        return _diff(self.finished_time, self.arrival_time)

    @property
    def decode_time(self) -> float | None:
        return _diff(self.finished_time, self.first_token_time)

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or self.num_output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.num_output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        """Raw events and derived metrics, JSON-ready."""
        return {
            "req_id": self.req_id,
            "arrival_time": self.arrival_time,
            "first_scheduled_time": self.first_scheduled_time,
            "first_token_time": self.first_token_time,
            "finished_time": self.finished_time,
            "finish_reason": self.finish_reason,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "num_preemptions": self.num_preemptions,
            "token_times": list(self.token_times),
            "queue_time": self.queue_time,
            "prefill_time": self.prefill_time,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "e2e": self.e2e,
            "decode_time": self.decode_time,
        }


def _diff(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return later - earlier
