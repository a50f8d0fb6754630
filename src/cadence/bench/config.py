"""Frozen configuration of one benchmark: what to send, when to send it, and what counts as good.

Each component receives only its own slice: workloads get `WorkloadConfig`, the arrival process
gets `ArrivalConfig`, the metrics get `SLOConfig` and the thresholds in `AnalysisConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WORKLOAD_NAMES = ("chat", "rag", "coding", "doc-burst", "mix")
ARRIVAL_KINDS = ("auto", "concurrency", "poisson", "gamma", "sweep", "script")


@dataclass(frozen=True)
class WorkloadConfig:
    """The requests of a workload. Lengths are in tokens (exact when a tokenizer is available).

    Fields a workload does not use are ignored by it (e.g. `num_docs` only matters to doc-burst).
    """

    name: str = "chat"
    seed: int = 0
    num_requests: int = 32
    # Short prompts (chat turns, questions, decoding streams): inclusive token range.
    short_tokens: tuple[int, int] = (16, 96)
    # Long prompts: doc-burst documents, rag/coding shared contexts, the tail cap of `mix`.
    long_tokens: int = 1024
    # Generated tokens per request (inclusive range); `ignore_eos` makes the server honour it.
    output_tokens: tuple[int, int] = (64, 64)
    # doc-burst: K streams decode while D long documents arrive (documents generate doc_output).
    num_streams: int = 4
    num_docs: int = 1
    doc_output_tokens: int = 8
    # doc-burst: seconds between the streams' first tokens and the documents' arrival, and
    # between consecutive documents.
    doc_delay_s: float = 0.2
    doc_gap_s: float = 0.0
    # rag/coding: how many distinct shared contexts the questions are spread over.
    num_contexts: int = 2

    def __post_init__(self) -> None:
        if self.name not in WORKLOAD_NAMES:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        _check_range("short_tokens", self.short_tokens, minimum=1)
        _check_range("output_tokens", self.output_tokens, minimum=1)
        if self.long_tokens < 1:
            raise ValueError(f"long_tokens must be >= 1, got {self.long_tokens}")
        if self.num_streams < 0 or self.num_docs < 0 or self.num_streams + self.num_docs < 1:
            raise ValueError("doc-burst needs num_streams >= 0, num_docs >= 0 and at least one request")
        if self.doc_output_tokens < 1:
            raise ValueError(f"doc_output_tokens must be >= 1, got {self.doc_output_tokens}")
        if self.doc_delay_s < 0 or self.doc_gap_s < 0:
            raise ValueError("doc_delay_s and doc_gap_s must be >= 0")
        if self.num_contexts < 1:
            raise ValueError(f"num_contexts must be >= 1, got {self.num_contexts}")


@dataclass(frozen=True)
class ArrivalConfig:
    """When requests are sent.

    - concurrency: `concurrency` requests in flight; the next one leaves when one finishes.
    - poisson: exponential inter-arrival times at `rate` requests/s.
    - gamma: gamma inter-arrival times at `rate` with shape `burstiness` (< 1 burstier than
      Poisson, 1 is Poisson, > 1 more regular), as vLLM's benchmark does.
    - sweep: one poisson/gamma run per rate in `rates`, same requests each time.
    - script: the workload's own schedule (doc-burst: streams first, then documents).
    - auto: the workload's default (script for doc-burst, concurrency otherwise).
    """

    kind: str = "auto"
    concurrency: int = 4
    rate: float = 1.0
    burstiness: float = 1.0
    rates: tuple[float, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"unknown arrival {self.kind!r}; choose from {', '.join(ARRIVAL_KINDS)}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.kind == "sweep" and not self.rates:
            raise ValueError("a rate sweep needs rates (e.g. --rates 0.5,1,2)")
        if any(r <= 0 for r in self.rates):
            raise ValueError(f"rates must be > 0, got {self.rates}")


SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


@dataclass(frozen=True)
class SLOConfig:
    """Per-request service objectives in seconds; None means not set.

    A request meets the SLO when ttft <= ttft, its largest inter-token gap <= itl (every token
    arrives within `itl` of the previous one), tpot <= tpot and e2e <= e2e.
    """

    ttft: float | None = None
    itl: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ValueError(f"SLO {key} must be > 0 seconds, got {value}")

    def limits(self) -> dict[str, float]:
        """The SLOs that are set, by name."""
        return {k: getattr(self, k) for k in SLO_KEYS if getattr(self, k) is not None}

    @classmethod
    def parse(cls, text: str | None) -> "SLOConfig":
        """Parse "ttft=0.5,itl=0.1" (seconds). An empty or None string sets no SLO."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, raw = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in SLO_KEYS:
                raise ValueError(f"bad SLO {part!r}: expected NAME=SECONDS with NAME in {', '.join(SLO_KEYS)}")
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"bad SLO value in {part!r}: {raw!r} is not a number") from None
        return cls(**values)


@dataclass(frozen=True)
class AnalysisConfig:
    """How records are classified and bucketed.

    `long_prompt_tokens`: a request whose prompt has at least this many tokens is "long"; its
    prefill window is [send, first token]. None lets the workload choose its own threshold.
    `ttft_buckets`: upper edges (tokens) of the prompt-length buckets for TTFT; the last bucket
    is open-ended.
    """

    long_prompt_tokens: int | None = None
    ttft_buckets: tuple[int, ...] = (64, 256, 1024, 4096)
    slo: SLOConfig = field(default_factory=SLOConfig)

    def __post_init__(self) -> None:
        if self.long_prompt_tokens is not None and self.long_prompt_tokens < 1:
            raise ValueError(f"long_prompt_tokens must be >= 1, got {self.long_prompt_tokens}")
        if list(self.ttft_buckets) != sorted(set(self.ttft_buckets)) or any(b < 1 for b in self.ttft_buckets):
            raise ValueError(f"ttft_buckets must be increasing positive token counts, got {self.ttft_buckets}")


@dataclass(frozen=True)
class ClientConfig:
    """How the streaming client talks to the server."""

    url: str
    model: str | None = None
    temperature: float = 0.0
    request_timeout_s: float = 300.0
    ignore_eos: bool = True
    # Ask for logprobs=0 so each chunk lists its tokens: exact per-chunk counts when a server
    # sends several tokens in one chunk (costs the server a little work).
    request_logprobs: bool = False
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class BenchConfig:
    """Everything one `cadence bench` invocation needs."""

    client: ClientConfig
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    arrival: ArrivalConfig = field(default_factory=ArrivalConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # Path of a tokenizer for exact lengths (None: the default cadence model's, when importable).
    tokenizer: str | None = None
    use_tokenizer: bool = True
    # Seconds between /metrics scrapes; 0 disables scraping.
    metrics_interval_s: float = 0.25
    progress: bool = True
    label: str = ""

    def __post_init__(self) -> None:
        if self.metrics_interval_s < 0:
            raise ValueError(f"metrics_interval_s must be >= 0, got {self.metrics_interval_s}")


def _check_range(name: str, value: tuple[int, int], minimum: int) -> None:
    lo, hi = value
    if lo < minimum or hi < lo:
        raise ValueError(f"{name} must be a range MIN:MAX with {minimum} <= MIN <= MAX, got {lo}:{hi}")
