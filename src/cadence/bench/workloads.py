"""Seeded workloads: the requests of a benchmark, with exact (or stated approximate) lengths.

- chat: short, distinct prompts.
- rag: a few long shared contexts (retrieved passages), each request one context plus its own
  question; the shared prefix is what a prefix cache can reuse.
- coding: like rag with code-like repository contexts.
- doc-burst: K streams start decoding, then D long documents arrive (phase 1 of the script).
- mix: lognormal prompt lengths with a long tail up to `long_tokens`.

Every prompt is built from its own seeded generator, so the same config gives the same requests
and no two prompts share text unless the workload says so (rag/coding contexts).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from cadence.bench.config import WorkloadConfig
from cadence.bench.prompt_builder import PieceCounts, build_text
from cadence.bench.text_source import code_pieces, english_pieces, seeded_rng
from cadence.bench.token_counter import TokenCounter


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. `phase` orders scripted arrivals (doc-burst: 0 streams, 1 docs);
    `context_id` names the shared prefix a rag/coding request uses (None: no shared text)."""

    index: int
    kind: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    phase: int = 0
    context_id: int | None = None

    @property
    def prompt_sha1(self) -> str:
        return hashlib.sha1(self.prompt.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Workload:
    """The generated requests plus what the analysis needs to know about them."""

    config: WorkloadConfig
    requests: tuple[RequestSpec, ...]
    # Prompts with at least this many tokens are "long" unless the user sets a threshold.
    long_prompt_tokens: int
    default_arrival: str
    tokens_exact: bool
    token_source: str
    # doc-burst: seconds after phase 0 is decoding before phase 1 starts, and between its sends.
    script_delay_s: float = 0.0
    script_gap_s: float = 0.0


def build_workload(cfg: WorkloadConfig, counter: TokenCounter) -> Workload:
    """Generate the requests of `cfg.name`; raises ValueError for impossible sizes."""
    counts = PieceCounts(counter)
    builders = {"chat": _chat, "rag": _rag, "coding": _coding, "doc-burst": _doc_burst, "mix": _mix}
    requests, long_threshold = builders[cfg.name](cfg, counts)
    _check_distinct(requests)
    return Workload(
        config=cfg,
        requests=tuple(requests),
        long_prompt_tokens=long_threshold,
        default_arrival="script" if cfg.name == "doc-burst" else "concurrency",
        tokens_exact=counter.exact,
        token_source=counter.source,
        script_delay_s=cfg.doc_delay_s if cfg.name == "doc-burst" else 0.0,
        script_gap_s=cfg.doc_gap_s if cfg.name == "doc-burst" else 0.0,
    )


def _output_len(cfg: WorkloadConfig, kind: str, index: int) -> int:
    lo, hi = cfg.output_tokens
    return seeded_rng(cfg.seed, cfg.name, kind, "out", index).randint(lo, hi)


def _short_len(cfg: WorkloadConfig, kind: str, index: int) -> int:
    lo, hi = cfg.short_tokens
    return seeded_rng(cfg.seed, cfg.name, kind, "len", index).randint(lo, hi)


def _english(cfg: WorkloadConfig, counts: PieceCounts, kind: str, index: int, n: int, prefix: str = "") -> tuple[str, int]:
    return build_text(counts, n, english_pieces(seeded_rng(cfg.seed, cfg.name, kind, index)), prefix=prefix)


def _chat(cfg: WorkloadConfig, counts: PieceCounts) -> tuple[list[RequestSpec], int]:
    reqs = []
    for i in range(cfg.num_requests):
        text, n = _english(cfg, counts, "chat", i, _short_len(cfg, "chat", i))
        reqs.append(RequestSpec(i, "chat", text, n, _output_len(cfg, "chat", i)))
    # Nothing in chat is long by design; a user threshold can still single some out.
    return reqs, cfg.short_tokens[1] + 1


def _shared_context_requests(cfg: WorkloadConfig, counts: PieceCounts, code: bool) -> tuple[list[RequestSpec], int]:
    kind = "coding" if code else "rag"
    contexts = []
    for c in range(cfg.num_contexts):
        rng = seeded_rng(cfg.seed, cfg.name, "context", c)
        header = "Repository files:\n" if code else "Retrieved passages:\n"
        pieces = code_pieces(rng) if code else english_pieces(rng)
        contexts.append(build_text(counts, cfg.long_tokens, pieces, prefix=header)[0])
    reqs = []
    for i in range(cfg.num_requests):
        ctx_id = i % cfg.num_contexts
        prefix = contexts[ctx_id] + "\n\nQuestion:"
        target = counts.counter.count(prefix) + _short_len(cfg, kind, i)
        text, n = _english(cfg, counts, kind, i, target, prefix=prefix)
        reqs.append(RequestSpec(i, kind, text, n, _output_len(cfg, kind, i), context_id=ctx_id))
    return reqs, cfg.long_tokens


def _rag(cfg: WorkloadConfig, counts: PieceCounts) -> tuple[list[RequestSpec], int]:
    return _shared_context_requests(cfg, counts, code=False)


def _coding(cfg: WorkloadConfig, counts: PieceCounts) -> tuple[list[RequestSpec], int]:
    return _shared_context_requests(cfg, counts, code=True)


def _doc_burst(cfg: WorkloadConfig, counts: PieceCounts) -> tuple[list[RequestSpec], int]:
    reqs = []
    for i in range(cfg.num_streams):
        text, n = _english(cfg, counts, "stream", i, _short_len(cfg, "stream", i))
        reqs.append(RequestSpec(len(reqs), "stream", text, n, _output_len(cfg, "stream", i), phase=0))
    for d in range(cfg.num_docs):
        text, n = _english(cfg, counts, "document", d, cfg.long_tokens, prefix="Summarize this document:")
        reqs.append(RequestSpec(len(reqs), "document", text, n, cfg.doc_output_tokens, phase=1))
    threshold = max(cfg.short_tokens[1] + 1, cfg.long_tokens // 2)
    return reqs, min(threshold, cfg.long_tokens)


def _mix(cfg: WorkloadConfig, counts: PieceCounts) -> tuple[list[RequestSpec], int]:
    lo, hi = cfg.short_tokens
    top = max(cfg.long_tokens, hi)
    # Lognormal around the short range's geometric mean; sigma 1.2 puts ~1 in 100 prompts
    # beyond 16x the median: a long tail.
    median = math.sqrt(lo * hi)
    reqs = []
    for i in range(cfg.num_requests):
        draw = seeded_rng(cfg.seed, cfg.name, "mixlen", i).lognormvariate(math.log(median), 1.2)
        n_target = int(min(max(round(draw), lo), top))
        text, n = _english(cfg, counts, "mix", i, n_target)
        reqs.append(RequestSpec(i, "mix", text, n, _output_len(cfg, "mix", i)))
    return reqs, min(top, 4 * hi)


def _check_distinct(requests: list[RequestSpec]) -> None:
    seen: dict[str, int] = {}
    for r in requests:
        if r.prompt in seen:
            # Collisions only happen for tiny lengths with few choices; say so rather than send
            # duplicates that a prefix cache would turn into a different benchmark.
            raise ValueError(
                f"requests {seen[r.prompt]} and {r.index} got the same prompt; use longer prompts or another seed"
            )
        seen[r.prompt] = r.index
