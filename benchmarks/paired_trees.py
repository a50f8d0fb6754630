"""Two source trees of cadence, A/B on llama-bench's tg workload, alternated run by run in one call.

paired_decode.py starts a fresh process per tree and round; on the test host a process's step
moves by 10-20% against the next one minutes later (the memory bandwidth the host gives, and
where the repacked weights' huge pages land), more than many changes are worth. Here each tree
runs in one long-lived tg_worker.py (its PYTHONPATH pointing at the tree: its own Python and its
own kernel build, chosen by source hash), both loaded once; every round runs tg N on each tree,
back to back (the order flips each round), then one llama-bench tg N of the build matched to the
tier (llama.cpp's AVX2-only build for --tier avx2, its native one otherwise). It prints each
round's mean step per tree, the ratio to llama.cpp, and the ratio between the trees per round.

    CADENCE_LLAMACPP_CACHE=/work/cache/llamacpp .venv/bin/python benchmarks/paired_trees.py \\
        --tier avx2 --rounds 5 --tree main=/work/main/src --tree branch=src
    ... --model SmolLM2-135M-Instruct.Q4_1.gguf --batch 1 8 --no-llamacpp (1 and 8 streams, the trees alone)

Reports, never asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import llamacpp_peer
from paired_decode import TgChild

DEFAULT_MODEL = "/work/cache/shapes/llama-3.2-1b-random-Q4_K_M.gguf"


def start_children(trees: dict[str, str], args) -> dict[str, TgChild]:
    """One tg_worker per tree, each importing cadence from its own tree."""
    children = {}
    saved = os.environ.get("PYTHONPATH")
    try:
        for name, src in trees.items():
            os.environ["PYTHONPATH"] = os.path.abspath(src)
            t0 = time.perf_counter()
            children[name] = TgChild(args.model, args.threads, args.tier, False)
            print(f"{name} ({src}): ready in {time.perf_counter() - t0:.1f} s "
                  f"({children[name].ready['fast_path']}); load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return children


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="a GGUF file")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                   help="a tree's name and its src folder (twice or more; default main=/work/main/src "
                        "branch=src)")
    p.add_argument("--tier", default="avx2", choices=("native", "avx512", "avx2"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=128, help="tokens per run (llama-bench -n), both sides")
    p.add_argument("--batch", type=int, nargs="+", default=[1],
                   help="requests decoding at once in cadence's runs, one or more sizes, each run in "
                        "every round (a size > 1 has no llama-bench round: its step is B tokens)")
    p.add_argument("--no-llamacpp", action="store_true", help="the trees only, no llama-bench rounds")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) or {"main": "/work/main/src", "branch": "src"}
    variant = "avx2" if args.tier == "avx2" else "native"
    peer_rounds = not args.no_llamacpp and 1 in args.batch
    if peer_rounds and llamacpp_peer.binary("llama-bench", variant) is None:
        print(f"llama.cpp's {variant} build is missing (llamacpp_peer.py, or CADENCE_LLAMACPP_CACHE; "
              "--no-llamacpp runs the trees alone)")
        return 1
    children = start_children(trees, args)
    # Per (tree, batch) and round: mean step seconds, and the median of the steps' wall time
    # outside the executor (scheduler, sampling's outputs, detokenization, telemetry).
    steps: dict[tuple[str, int], list[float]] = {(n, b): [] for n in trees for b in args.batch}
    outside: dict[tuple[str, int], list[float]] = {(n, b): [] for n in trees for b in args.batch}
    ratios: dict[str, list[float]] = {n: [] for n in trees}  # batch 1 against llama-bench
    try:
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for b in args.batch:
                for name in order:
                    run = children[name].run(args.n, 0, b)
                    steps[name, b].append(run["seconds"] / len(run["step_s"]))
                    outside[name, b].append(statistics.median(s - e for s, e in zip(run["step_s"], run["executor_s"])))
                print(f"round {r + 1} batch {b}: " + ", ".join(
                    f"{n} {steps[n, b][-1] * 1e3:.3f} ms ({b / steps[n, b][-1]:.1f} tok/s)" for n in trees)
                    + f"; load {os.getloadavg()[0]:.2f}", flush=True)
            if not peer_rounds:
                continue
            peer = llamacpp_peer.llama_bench(args.model, args.threads, f"tg{args.n}", repetitions=1,
                                             depths=(0,), variant=variant)
            if isinstance(peer, str):
                print(f"llama-bench failed: {peer}")
                return 1
            tok_s = peer[f"tg{args.n}"]
            for name in trees:
                ratios[name].append(1.0 / steps[name, 1][-1] / tok_s)
            print(f"round {r + 1}: " + ", ".join(f"{n} {ratios[n][-1]:.3f}x" for n in trees)
                  + f" llama.cpp {variant}'s {tok_s:.2f} tok/s; load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for child in children.values():
            child.close()
    names = list(trees)
    for b in args.batch:
        for name in names:
            median = statistics.median(steps[name, b])
            peer_part = (f"; cadence / llama.cpp median {statistics.median(ratios[name]):.3f}x (rounds "
                         f"{', '.join(f'{x:.3f}' for x in ratios[name])})" if b == 1 and ratios[name] else "")
            print(f"{name} batch {b}: step median {median * 1e3:.3f} ms ({b / median:.1f} tok/s), outside "
                  f"the executor {statistics.median(outside[name, b]) * 1e3:.3f} ms{peer_part}", flush=True)
        for other in names[1:]:
            per_round = [y / x for x, y in zip(steps[names[0], b], steps[other, b])]
            print(f"batch {b}: {other} / {names[0]} step per round: {' '.join(f'{x:.3f}' for x in per_round)}; "
                  f"median {statistics.median(per_round):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
