"""Hand-made request records for the metric tests."""

from __future__ import annotations

from cadence.bench.records import STATUS_FAILED, Failure, RequestRecord


def make_record(index: int, send: float, chunks: list[tuple[float, int]], end: float | None = None,
                prompt_tokens: int = 10, usage: int | None = None, failure: Failure | None = None,
                kind: str = "chat") -> RequestRecord:
    """chunks: (arrival time, tokens carried). end defaults to the last chunk's time."""
    rec = RequestRecord(
        index=index, kind=kind, prompt_tokens=prompt_tokens, max_tokens=64, prompt_sha1="0" * 40,
        send_time=send,
        end_time=end if end is not None else (chunks[-1][0] if chunks else send),
        chunk_times=[t for t, _ in chunks], chunk_tokens=[k for _, k in chunks],
        usage_completion_tokens=usage, finish_reason=None if failure else "length",
    )
    if failure is not None:
        rec.status = STATUS_FAILED
        rec.failure = failure
    return rec
