"""cadence next to llama.cpp in alternating rounds: the ratio per round and its median.

perf_bench.py runs llama-bench after all of cadence's rows, minutes later; on a shared machine
whose speed moves by 2x between minutes that ratio is noise. Here each round times cadence's
decode at batch 1 (context 512) and prefill (512 and 2048 tokens), then llama-bench's tg128 on
the shipped Q4_1 GGUF (llama.cpp's fastest decode here) and pp512 on it and on an F16 copy (the
better of the two), same threads, so a ratio compares the two in the same minute. Needs llama.cpp built once:
    .venv/bin/python benchmarks/llamacpp_peer.py --build
    .venv/bin/python benchmarks/paired_llamacpp.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import llamacpp_peer
from perf_bench import cadence_decode_s, cadence_prefill_s

from cadence.model.loader import default_model_path, load_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--decode-steps", type=int, default=40, help="decode steps timed per round")
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 2048])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if llamacpp_peer.binary("llama-bench") is None:
        print("llama.cpp is not built: run benchmarks/llamacpp_peer.py --build first")
        return 1
    loaded = load_model(None, dtype="auto")
    gguf = default_model_path()
    f16 = llamacpp_peer.f16_file(gguf)
    print(f"cadence: {loaded.name}, {loaded.dtype}, {loaded.model.decode_weight_format} weights; "
          f"llama.cpp: {gguf.rsplit('/', 1)[-1]}; {args.threads} threads")
    decode_ratios: list[float] = []
    prefill_ratios: dict[int, list[float]] = {n: [] for n in args.prompt_lens}
    for r in range(args.rounds):
        b1 = 1 / cadence_decode_s(loaded, 1, 512, args.decode_steps)
        prefill = {n: n / cadence_prefill_s(loaded, n, 1) for n in args.prompt_lens}
        peer = llamacpp_peer.llama_bench(gguf, args.threads, "pp512,tg128", repetitions=1)
        if isinstance(peer, str):
            print(f"llama-bench failed: {peer}")
            return 1
        if f16 is not None:  # llama.cpp's prefill is as fast or faster on F16 weights
            f16_pp = llamacpp_peer.llama_bench(f16, args.threads, "pp512", repetitions=1)
            if not isinstance(f16_pp, str):
                peer["pp512"] = max(peer["pp512"], f16_pp["pp512"])
        decode_ratios.append(b1 / peer["tg128"])
        for n in args.prompt_lens:
            prefill_ratios[n].append(prefill[n] / peer["pp512"])
        print(f"round {r + 1}: cadence decode b1 ctx512 {b1:.1f} tok/s vs llama.cpp tg128 "
              f"{peer['tg128']:.1f} ({decode_ratios[-1]:.2f}x); "
              + "; ".join(f"prefill {n} {prefill[n]:.1f} tok/s ({prefill_ratios[n][-1]:.2f}x)"
                          for n in args.prompt_lens)
              + f" vs pp512 {peer['pp512']:.1f}", flush=True)
    print(f"median of {args.rounds} rounds: decode b1 {statistics.median(decode_ratios):.2f}x "
          f"llama.cpp tg128; "
          + "; ".join(f"prefill {n} {statistics.median(v):.2f}x pp512" for n, v in prefill_ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
