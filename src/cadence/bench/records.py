"""The raw per-request record: what was sent and when every streamed chunk arrived.

Times are seconds since the run started (time.perf_counter based). Records are the ground truth
the metrics are computed from, and they are stored verbatim in the JSON result so that any
number in a report can be recomputed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATUS_OK = "ok"
STATUS_FAILED = "failed"


@dataclass(frozen=True)
class Failure:
    """Why a request failed. `kind`: http (non-200 status), server_error (an error event in the
    stream), stream_cut (connection closed before the end), timeout, connect, finish_reason
    (the server ended it with abort/error), client (other client-side error)."""

    kind: str
    message: str
    http_status: int | None = None


@dataclass
class RequestRecord:
    """One request's timeline. chunk_times[i] is when chunk i arrived, chunk_tokens[i] how many
    output tokens it carried (see metrics.py for how ITL treats multi-token chunks)."""

    index: int
    kind: str
    prompt_tokens: int
    max_tokens: int
    prompt_sha1: str
    send_time: float
    end_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    status: str = STATUS_OK
    failure: Failure | None = None
    finish_reason: str | None = None
    # From the final usage chunk, when the server sends one (stream_options.include_usage).
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    # Whether the per-chunk counts came from logprobs.tokens (exact) or one per text chunk.
    counted_by_logprobs: bool = False

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def first_token_time(self) -> float | None:
        for t, k in zip(self.chunk_times, self.chunk_tokens):
            if k > 0:
                return t
        return None

    @property
    def observed_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def output_tokens(self) -> int:
        """Output tokens: the server's usage count when given, else the tokens seen."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.observed_tokens

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failure"] = asdict(self.failure) if self.failure else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RequestRecord":
        data = dict(data)
        failure = data.pop("failure", None)
        return cls(**data, failure=Failure(**failure) if failure else None)
