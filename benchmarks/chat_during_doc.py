"""A short chat message arriving while a long document is in prefill: its TTFT against its TTFT
on an idle engine (acceptance of issue 18: <= 2x), with several partial prefills (short prompts
first, the slo default) and with one (the document holds the queue).

Offline through the engine, default flags unless said. The chat arrives halfway through a step
of the document's prefill (its arrival time is the middle of the step running when it comes), so
its TTFT includes the wait for that step, as on a server: with interjection (the default,
--interject-short-prompts) the engine notices it between two layers of that step and runs it
there; without, it waits for the step's end. `--streams` requests decode meanwhile (with none,
the slo policy runs the document in one step). Run:
    .venv/bin/python benchmarks/chat_during_doc.py --streams 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from interference_offline import STREAM_PROMPTS, document_ids

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model

CHAT = "What is the capital of France? Answer in one word."


def run(loaded, partial: int | None, args, with_doc: bool, interject: bool = True) -> float:
    """The chat's TTFT (s) on a fresh engine, with or without the document in prefill."""
    knobs = {"max_model_len": args.doc_tokens + 512, "interject_short_prompts": interject}
    if partial is not None:
        knobs["max_num_partial_prefills"] = partial
    engine = LLMEngine.from_loaded(loaded, EngineConfig(
        scheduler=SchedulerConfig(**knobs),
        cache=CacheConfig(kv_cache_memory_bytes=1 << 30),
    ))
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i in range(args.streams):
        engine.add_request(f"s{i}", STREAM_PROMPTS[i % len(STREAM_PROMPTS)],
                           SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True))
    while any(engine.scheduler.get_request(f"s{i}").num_output_tokens == 0
              for i in range(args.streams)):
        engine.step()
    last_step_s = 0.0
    if with_doc:
        engine.add_request("doc", document_ids(loaded.tokenizer, args.doc_tokens), params)
        # Let the document get part-way through its prompt.
        while engine.scheduler.get_request("doc").num_computed_tokens < args.doc_tokens // 4:
            t0 = time.monotonic()
            engine.step()
            last_step_s = time.monotonic() - t0
    # The chat arrives halfway through the next step (predicted as long as the last one), as
    # on a server; the engine sees it at its next poll between two layers (the engine loop's
    # role, LLMEngine.set_interjection_hooks), or after the step when nothing polls.
    arrival = time.monotonic() + last_step_s / 2

    def poll() -> None:
        if engine.scheduler.get_request("chat") is None and time.monotonic() >= arrival:
            engine.add_request("chat", CHAT, params, arrival_time=arrival)

    engine.set_interjection_hooks(poll)
    engine.step()  # the step in flight when the chat arrives
    engine.set_interjection_hooks(None)
    if engine.scheduler.get_request("chat") is None and engine.telemetry.timeline("chat") is None:
        engine.add_request("chat", CHAT, params, arrival_time=min(arrival, time.monotonic()))
    if with_doc and engine.scheduler.get_request("doc").is_prefill_done:
        # With nothing decoding the slo policy runs the whole document in one step: the chat
        # then only waited for that step. Say so rather than report a mid-document TTFT.
        print("note: the document's prefill ended before the chat arrived (one big step)")
    while engine.scheduler.get_request("chat") is not None and \
            engine.scheduler.get_request("chat").num_output_tokens == 0:
        engine.step()
    return engine.telemetry.timeline("chat").ttft


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--doc-tokens", type=int, default=2000)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    loaded = load_model(args.model, dtype=args.dtype)
    print(f"model {loaded.name}, {loaded.dtype}; {args.streams} streams decoding; "
          f"a {args.doc_tokens}-token document; median of {args.repeats}")
    run(loaded, None, argparse.Namespace(**{**vars(args), "doc_tokens": 256}), True)  # warm-up
    rows = []
    quiet = argparse.Namespace(**{**vars(args), "streams": 0})
    for label, partial, interject in (
            ("default (slo, 4 partial, interjection)", None, True),
            ("--no-interject-short-prompts", None, False),
            ("--max-num-partial-prefills 1", 1, True)):
        empty, idle, busy = [], [], []
        for _ in range(args.repeats):
            # Idle twice over: an empty engine (nothing else at all), and the same streams
            # decoding without the document (what the document alone adds).
            empty.append(run(loaded, partial, quiet, with_doc=False, interject=interject))
            idle.append(run(loaded, partial, args, with_doc=False, interject=interject))
            busy.append(run(loaded, partial, args, with_doc=True, interject=interject))
        rows.append((label, statistics.median(empty), statistics.median(idle),
                     statistics.median(busy),
                     statistics.median(b / e for b, e in zip(busy, empty)),
                     statistics.median(b / i for b, i in zip(busy, idle))))
    print(f"{'scheduler':38s} {'empty engine':>12s} {'streams only':>12s} {'mid-doc TTFT':>13s} "
          f"{'/ empty':>8s} {'/ streams':>9s}")
    for label, empty, idle, busy, r_empty, r_idle in rows:
        print(f"{label:38s} {empty * 1e3:10.0f}ms {idle * 1e3:10.0f}ms {busy * 1e3:11.0f}ms "
              f"{r_empty:8.2f} {r_idle:9.2f}")
    print("TTFTs: medians; ratios: medians of per-repeat ratios (same round)")
    print("acceptance: mid-doc TTFT <= 2x idle TTFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
