"""Simulated workloads: when each request arrives, how long its prompt is, how much it writes."""

from __future__ import annotations

import random
from dataclasses import dataclass

STREAM = "stream"
DOCUMENT = "document"


@dataclass(frozen=True)
class SimRequestSpec:
    """One request of a simulated workload; it always writes exactly `output_tokens`."""

    req_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    kind: str = STREAM

    def __post_init__(self) -> None:
        if self.arrival_s < 0:
            raise ValueError(f"{self.req_id}: arrival_s must be >= 0, got {self.arrival_s}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"{self.req_id}: prompt and output need >= 1 token each")


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[SimRequestSpec, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        ids = [r.req_id for r in self.requests]
        if len(ids) != len(set(ids)):
            raise ValueError("request ids of a workload must be unique")

    @property
    def total_tokens(self) -> int:
        return sum(r.prompt_tokens + r.output_tokens for r in self.requests)


def doc_burst(
    num_streams: int = 8,
    stream_prompt_tokens: int = 256,
    stream_output_tokens: int = 600,
    doc_prompt_tokens: int = 4096,
    doc_output_tokens: int = 32,
    doc_arrival_s: float = 1.0,
    stream_arrival_window_s: float = 0.2,
    seed: int = 0,
) -> Workload:
    """K streams arrive (spread over a short window, prompts +-25% around the given length)
    and decode; then one long document arrives while they stream. The question: how long do
    the streams stall while the document's prompt is computed, and what does it cost its TTFT."""
    if num_streams < 0:
        raise ValueError(f"num_streams must be >= 0, got {num_streams}")
    rng = random.Random(seed)
    requests = []
    for i in range(num_streams):
        prompt = max(1, round(stream_prompt_tokens * rng.uniform(0.75, 1.25)))
        arrival = rng.uniform(0.0, stream_arrival_window_s)
        requests.append(SimRequestSpec(f"stream-{i}", arrival, prompt, stream_output_tokens))
    requests.append(
        SimRequestSpec("doc", doc_arrival_s, doc_prompt_tokens, doc_output_tokens, DOCUMENT)
    )
    return Workload("doc-burst", tuple(sorted(requests, key=lambda r: r.arrival_s)), seed)


def prompt_token_ids(spec: SimRequestSpec, vocab_size: int, seed: int) -> list[int]:
    """Deterministic random prompt ids (ids 0-2 avoided: they are specials in most vocabularies).
    Distinct requests get distinct prompts, so the prefix cache never hits by accident."""
    rng = random.Random(f"{seed}:{spec.req_id}")
    return [rng.randrange(3, vocab_size) for _ in range(spec.prompt_tokens)]
