"""A long-lived cadence engine that runs llama-bench's tg workload on request (paired_decode.py's child).

The kernel tier is chosen when cadence's kernels load (CADENCE_ISA, read at import), so each tier
runs in a process of its own: paired_decode.py starts this script with the tier's environment,
and the engine (LLM with default settings: `cadence serve`'s engine, its scheduler and step loop,
the fused GGUF decode stack for a plain-Llama GGUF) stays loaded between rounds.

Protocol: one JSON object per line on stdin, {"n": 128, "depth": 0[, "batch": 1]}; one JSON line back on the
reply pipe (the process's original stdout; anything else printing goes to stderr):
    {"seconds": wall seconds of the n timed steps, "step_s": [each step's wall seconds],
     "executor_s": [the executor's seconds inside each], "tokens": [the n tokens],
     "solo_steps": how many ran the fused stack on one thread (team.h's SoloSchedule: after a
     thread lost its core to another process, the next 64 steps run solo at ~half speed)}
The workload is llama-bench's `-n N -d D`: with D = 0 a one-token prompt (its one-row prefill is
llama.cpp's first decode at position 0) and N - 1 decode steps, N forward passes at positions
0..N-1; with D > 0 a D-token prompt computed untimed (as llama-bench's depth run), then N timed
decode steps at positions D..D+N-1. Greedy, ignore_eos: every step computes one token.

    CADENCE_ISA=avx2 .venv/bin/python benchmarks/tg_worker.py --model FILE --threads 2
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server runs (cadence/__init__.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import torch  # noqa: E402

from cadence.core.sampling_params import SamplingParams  # noqa: E402
from cadence.engine.llm import LLM  # noqa: E402
from cadence.model.kernels.isa import describe  # noqa: E402

FIRST_TOKEN = 1  # the one-token prompt of the depth-0 workload (any id in the vocabulary)


@dataclass
class TgRun:
    """One timed tg workload: wall seconds of each timed engine step, and the executor's share."""

    step_s: list[float] = field(default_factory=list)
    executor_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    solo_steps: int = 0

    @property
    def seconds(self) -> float:
        return sum(self.step_s)


def depth_prompt(depth: int, vocab_size: int) -> list[int]:
    """The untimed prompt of a depth run: fixed ids (the same every round, so from the second
    round on the prefix cache serves it; the decode steps after it read the same KV either way)."""
    g = torch.Generator().manual_seed(depth)
    return torch.randint(3, vocab_size, (depth,), generator=g).tolist()


def run_tg(llm: LLM, n: int, depth: int, req_id: str, batch: int = 1) -> TgRun:
    """llama-bench's `-n n -d depth` through the engine's step loop (module docstring); with
    batch B, B such requests at once (their prompts' first tokens differ), so each step decodes
    B rows; `tokens` are the first request's."""
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    team = getattr(getattr(engine.executor, "model", None), "decode_stack_team", lambda: None)
    params = SamplingParams(temperature=0.0, max_tokens=n + (1 if depth else 0), ignore_eos=True)
    ids = [req_id] + [f"{req_id}.{b}" for b in range(1, batch)]
    run = TgRun()
    start = time.perf_counter()
    for b, rid in enumerate(ids):
        prompt = depth_prompt(depth, vocab) if depth else [FIRST_TOKEN]
        engine.add_request(rid, [(prompt[0] + b) % vocab, *prompt[1:]], params)
    if depth:  # the depth prompts (and their first tokens) untimed, as llama-bench's depth run
        started: set[str] = set()
        while len(started) < batch:
            started.update(o.req_id for o in engine.step() if o.new_token_ids)
        start = time.perf_counter()
    running = set(ids)
    while running:
        outs = engine.step()
        now = time.perf_counter()
        run.step_s.append(now - start)
        run.executor_s.append(engine.last_executed[1])
        run.solo_steps += team() == 1 and torch.get_num_threads() > 1
        start = now
        for o in outs:
            if o.req_id == req_id:
                run.tokens += o.new_token_ids
            if o.finished:
                running.discard(o.req_id)
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-startup-profile", action="store_true",
                   help="skip the engine's startup profile (the slo policy's calibration; a single "
                        "stream's decode steps do not depend on it)")
    args = p.parse_args(argv)
    reply = os.fdopen(os.dup(1), "w")  # the protocol's pipe; stray prints go to stderr
    os.dup2(2, 1)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    llm = LLM(args.model, **({"startup_profile": False} if args.no_startup_profile else {}))
    fast_path = getattr(llm.engine, "fast_path", "")
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - start, "kernels": describe(),
                      "fast_path": str(fast_path)}), file=reply, flush=True)
    run_tg(llm, 4, 0, "warmup")  # first-step costs (kernel pools, page faults) untimed
    for i, line in enumerate(sys.stdin):
        ask = json.loads(line)
        run = run_tg(llm, int(ask["n"]), int(ask.get("depth", 0)), f"tg{i}", int(ask.get("batch", 1)))
        print(json.dumps({"seconds": run.seconds, "step_s": run.step_s, "executor_s": run.executor_s,
                          "tokens": run.tokens, "solo_steps": run.solo_steps}), file=reply, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
