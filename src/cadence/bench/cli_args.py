"""Argument parsing shared by `cadence bench` and `cadence sweep` (workload, arrival, analysis)."""

from __future__ import annotations

import argparse

from cadence.bench.config import (
    ARRIVAL_KINDS,
    WORKLOAD_NAMES,
    AnalysisConfig,
    ArrivalConfig,
    SLOConfig,
    WorkloadConfig,
)


def int_range(text: str) -> tuple[int, int]:
    """"64" -> (64, 64); "16:96" -> (16, 96)."""
    lo, sep, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX integers, got {text!r}") from None
    if pair[0] > pair[1]:
        raise argparse.ArgumentTypeError(f"MIN > MAX in {text!r}")
    return pair


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_workload_args(p: argparse.ArgumentParser) -> None:
    d = WorkloadConfig()
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=WORKLOAD_NAMES, default=d.name, help="which seeded workload to send")
    g.add_argument("--seed", type=int, default=d.seed, help="seed of prompts, lengths and arrivals")
    g.add_argument("--num-requests", type=int, default=d.num_requests, help="requests (chat, rag, coding, mix)")
    g.add_argument("--short-tokens", type=int_range, default=d.short_tokens, metavar="MIN:MAX",
                   help="short prompt / question / stream prompt length in tokens")
    g.add_argument("--long-tokens", type=int, default=d.long_tokens,
                   help="document length (doc-burst), shared context length (rag, coding), tail cap (mix)")
    g.add_argument("--output-tokens", type=int_range, default=d.output_tokens, metavar="MIN:MAX",
                   help="generated tokens per request (sent as max_tokens with ignore_eos)")
    g.add_argument("--streams", type=int, default=d.num_streams, help="doc-burst: decoding streams")
    g.add_argument("--docs", type=int, default=d.num_docs, help="doc-burst: long documents")
    g.add_argument("--doc-output-tokens", type=int, default=d.doc_output_tokens, help="doc-burst: tokens per document answer")
    g.add_argument("--doc-delay", type=float, default=d.doc_delay_s,
                   help="doc-burst: seconds after all streams decode before the documents are sent")
    g.add_argument("--doc-gap", type=float, default=d.doc_gap_s, help="doc-burst: seconds between documents")
    g.add_argument("--contexts", type=int, default=d.num_contexts, help="rag/coding: distinct shared contexts")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer for exact lengths (GGUF file, HF folder or tokenizer.json); "
                   "default: the default cadence model's")
    g.add_argument("--no-tokenizer", action="store_true", help="estimate lengths (stated in the result)")


def add_arrival_args(p: argparse.ArgumentParser) -> None:
    d = ArrivalConfig()
    g = p.add_argument_group("arrivals")
    g.add_argument("--arrival", choices=ARRIVAL_KINDS, default=d.kind,
                   help="auto: the workload's default (script for doc-burst, else concurrency)")
    g.add_argument("--concurrency", type=int, default=d.concurrency, help="requests in flight (concurrency)")
    g.add_argument("--rate", type=float, default=d.rate, help="requests/s (poisson, gamma)")
    g.add_argument("--burstiness", type=float, default=d.burstiness, help="gamma shape: <1 bursty, 1 Poisson")
    g.add_argument("--rates", type=float_list, default=(), help="rate sweep, e.g. 0.5,1,2")


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("analysis")
    g.add_argument("--slo", default="", help="per-request SLOs in seconds, e.g. ttft=0.5,itl=0.1 (also tpot, e2e)")
    g.add_argument("--long-prompt-tokens", type=int, default=None,
                   help="prompts with at least this many tokens are long (default: the workload's)")
    g.add_argument("--ttft-buckets", type=int_list, default=AnalysisConfig().ttft_buckets,
                   help="upper edges of the TTFT prompt-length buckets")


def workload_from_args(a: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(
        name=a.workload, seed=a.seed, num_requests=a.num_requests, short_tokens=a.short_tokens,
        long_tokens=a.long_tokens, output_tokens=a.output_tokens, num_streams=a.streams,
        num_docs=a.docs, doc_output_tokens=a.doc_output_tokens, doc_delay_s=a.doc_delay,
        doc_gap_s=a.doc_gap, num_contexts=a.contexts,
    )


def arrival_from_args(a: argparse.Namespace) -> ArrivalConfig:
    kind = "sweep" if a.rates and a.arrival == "auto" else a.arrival
    return ArrivalConfig(kind=kind, concurrency=a.concurrency, rate=a.rate, burstiness=a.burstiness,
                         rates=a.rates, seed=a.seed)


def analysis_from_args(a: argparse.Namespace) -> AnalysisConfig:
    return AnalysisConfig(long_prompt_tokens=a.long_prompt_tokens, ttft_buckets=a.ttft_buckets,
                          slo=SLOConfig.parse(a.slo))
