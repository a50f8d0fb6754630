"""Interference under Poisson arrivals: short chats with some long documents, per policy.

The doc-burst benchmark (interference_offline.py) measures one document landing on a few
streams; this one measures the tail that a stream of users feels. Requests arrive as a Poisson
process (`--rate` per second, seeded, the same schedule for every policy); a share
`--doc-share` of them are documents of `--doc-tokens` prompt tokens (a range: each document
draws its length), the rest chats of `--chat-tokens` prompt tokens that generate
`--chat-output` tokens (ignore_eos). Arrivals reach the engine between two layers of a step
(the interjection hook, as on a server) or between steps.

For each policy the table gives the ITL of every request pooled (p50, p99, max: the tail a
document's prefill puts on the chats that are decoding), the chats' and documents' TTFT, and
the wall time. Configs run round-robin per repeat (a burst of load on a shared host hits them
alike); the table shows medians over the repeats and the p99 ratio to eager per round. Run:
    .venv/bin/python benchmarks/interference_poisson.py --model FILE.gguf --rate 0.1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
from interference_offline import document_ids

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model

CHAT_WORDS = ("Tell me about the weather in spring and what to plant in a small garden "
              "near the sea, with a few tips for beginners and a short poem at the end. ")


@dataclass(frozen=True)
class Arrival:
    offset_s: float
    req_id: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class MixResult:
    config: str
    itl_p50_ms: float
    itl_p99_ms: float
    itl_max_ms: float
    chat_ttft_p50_ms: float
    chat_ttft_p99_ms: float
    doc_ttft_p50_ms: float
    wall_s: float
    num_itl: int


def schedule(tokenizer, args, seed: int) -> list[Arrival]:
    """The seeded arrival schedule (identical for every config)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / args.rate, size=args.requests)
    offsets = np.cumsum(gaps) - gaps[0]
    chat = tokenizer.encode(CHAT_WORDS * (1 + args.chat_tokens // 20))[:args.chat_tokens]
    longest = max(args.doc_tokens)
    doc_text = document_ids(tokenizer, longest)
    out = []
    for i, t in enumerate(offsets):
        if rng.random() < args.doc_share:
            n = int(rng.integers(min(args.doc_tokens), longest + 1))
            # Each document its own text (no prefix-cache hit between documents): a
            # distinct first token, then the shared body.
            ids = (int(rng.integers(1000, 5000)),) + tuple(doc_text[1:n])
            out.append(Arrival(float(t), f"doc-{i}", ids, args.doc_output))
        else:
            # Chats differ in their first token too (each its own conversation).
            ids = (int(rng.integers(1000, 5000)),) + tuple(chat[1:])
            out.append(Arrival(float(t), f"chat-{i}", ids, args.chat_output))
    return out


# The startup profile of the first engine that takes one (slo, adaptive), for the later ones:
# both policies then plan from the same calibration, and a 1B-shape run does not pay its ~20 s
# profile once per config and seed.
_PROFILE: list = []


def run_one(loaded, label: str, knobs: dict, arrivals: list[Arrival], args) -> MixResult:
    sched = SchedulerConfig(max_model_len=max(args.doc_tokens) + 256, **knobs)
    cfg = EngineConfig(
        scheduler=sched,
        cache=CacheConfig(kv_cache_memory_bytes=int(args.kv_gib * 1024**3)),
        startup_profile=not _PROFILE,
    )
    engine = LLMEngine.from_loaded(loaded, cfg)
    if engine.profile_samples:
        _PROFILE.extend(engine.profile_samples)
    elif _PROFILE and sched.models_step_time:
        engine.scheduler.calibrate(_PROFILE)
    pending = list(arrivals)
    t0 = time.monotonic()

    def admit_due() -> None:
        now = time.monotonic()
        while pending and t0 + pending[0].offset_s <= now:
            a = pending.pop(0)
            engine.add_request(a.req_id, list(a.prompt),
                               SamplingParams(temperature=0.0, max_tokens=a.max_tokens,
                                              ignore_eos=True),
                               arrival_time=t0 + a.offset_s)

    engine.set_interjection_hooks(admit_due)
    while pending or engine.has_unfinished():
        admit_due()
        if engine.has_unfinished():
            engine.step()
        elif pending:
            time.sleep(max(0.0, t0 + pending[0].offset_s - time.monotonic()))
    engine.set_interjection_hooks(None)
    wall = time.monotonic() - t0

    rec = engine.telemetry
    itl, chat_ttft, doc_ttft = [], [], []
    for a in arrivals:
        tl = rec.timeline(a.req_id)
        times = tl.token_times
        itl.extend(b - x for x, b in zip(times, times[1:]))
        (doc_ttft if a.req_id.startswith("doc") else chat_ttft).append(tl.ttft)
    q = statistics.quantiles
    return MixResult(
        config=label,
        itl_p50_ms=1e3 * statistics.median(itl),
        itl_p99_ms=1e3 * q(itl, n=100, method="inclusive")[-1],
        itl_max_ms=1e3 * max(itl),
        chat_ttft_p50_ms=1e3 * statistics.median(chat_ttft),
        chat_ttft_p99_ms=1e3 * q(chat_ttft, n=100, method="inclusive")[-1] if len(chat_ttft) > 1 else float("nan"),
        doc_ttft_p50_ms=1e3 * statistics.median(doc_ttft) if doc_ttft else float("nan"),
        wall_s=wall,
        num_itl=len(itl),
    )


CONFIGS = {
    "eager": {"policy": "eager", "max_num_batched_tokens": 4096},
    "chunked-256": {"policy": "chunked", "max_num_batched_tokens": 256},
    "chunked-512": {"policy": "chunked", "max_num_batched_tokens": 512},
    "default": {},
    # slo's colocated steps, and while a prompt waits beside running decodes its chunk runs on
    # every core with the decode steps between two of its layers (--core-split interleave).
    "adaptive": {"policy": "adaptive"},
}


def print_table(per: dict[str, list[MixResult]]) -> None:
    """Medians over the rounds of one schedule, the p99 ratio to eager per round."""
    print(f"\n{'config':12s} {'ITL p50':>8s} {'ITL p99':>8s} {'ITL max':>8s} {'p99/eager':>9s} "
          f"{'chat TTFT p50':>13s} {'doc TTFT p50':>12s}")
    base = per.get("eager")
    for c, rs in per.items():
        med = {f: statistics.median(getattr(r, f) for r in rs)
               for f in ("itl_p50_ms", "itl_p99_ms", "itl_max_ms", "chat_ttft_p50_ms",
                         "doc_ttft_p50_ms")}
        ratio = (statistics.median(r.itl_p99_ms / e.itl_p99_ms for r, e in zip(rs, base))
                 if base else float("nan"))
        print(f"{c:12s} {med['itl_p50_ms']:8.0f} {med['itl_p99_ms']:8.0f} {med['itl_max_ms']:8.0f} "
              f"{ratio:9.2f} {med['chat_ttft_p50_ms']:13.0f} {med['doc_ttft_p50_ms']:12.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct GGUF")
    p.add_argument("--rate", type=float, default=0.5, help="requests per second")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--doc-share", type=float, default=0.15)
    p.add_argument("--doc-tokens", type=int, nargs=2, default=[1000, 2000],
                   metavar=("MIN", "MAX"))
    p.add_argument("--doc-output", type=int, default=16)
    p.add_argument("--chat-tokens", type=int, default=48)
    p.add_argument("--chat-output", type=int, default=96)
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--kv-gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, nargs="+", default=[0],
                   help="arrival schedules; several: each one's rounds in turn, the table per seed "
                   "and the p99 ratios of every (seed, round)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    loaded = load_model(args.model)
    results: dict[int, dict[str, list[MixResult]]] = {}
    for seed in args.seed:
        arrivals = schedule(loaded.tokenizer, args, seed)
        num_docs = sum(a.req_id.startswith("doc") for a in arrivals)
        print(f"model {loaded.name}; seed {seed}: {len(arrivals)} requests at {args.rate}/s "
              f"({num_docs} documents of {args.doc_tokens[0]}-{args.doc_tokens[1]} tokens), "
              f"{args.repeats} round(s)", flush=True)
        per: dict[str, list[MixResult]] = {c: [] for c in args.configs}
        for rep in range(args.repeats):
            for c in args.configs:
                r = run_one(loaded, c, CONFIGS[c], arrivals, args)
                per[c].append(r)
                print(f"seed {seed} round {rep + 1} {c:12s} ITL p50 {r.itl_p50_ms:6.0f} p99 "
                      f"{r.itl_p99_ms:6.0f} max {r.itl_max_ms:6.0f} ms | chat TTFT p50 "
                      f"{r.chat_ttft_p50_ms:6.0f} p99 {r.chat_ttft_p99_ms:6.0f} | doc TTFT p50 "
                      f"{r.doc_ttft_p50_ms:6.0f} ms | {r.num_itl} ITLs, {r.wall_s:.0f} s", flush=True)
        results[seed] = per
        print_table(per)
    if len(args.seed) > 1:
        print("\nITL p99 / each baseline's, every (seed, round):")
        for c in args.configs:
            for base in ("eager", "chunked-512"):
                if base == c or base not in args.configs:
                    continue
                ratios = [r.itl_p99_ms / b.itl_p99_ms for per in results.values()
                          for r, b in zip(per[c], per[base])]
                print(f"  {c:12s} / {base:11s}: " + " ".join(f"{x:.2f}" for x in ratios))
    print("acceptance: default's ITL p99 no worse than eager's and chunked-512's (same round)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({str(seed): {c: [asdict(r) for r in rs] for c, rs in per.items()}
                       for seed, per in results.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
