"""What prompt logprobs cost: one prompt prefilled (max_tokens=1) with and without
SamplingParams.prompt_logprobs, on the default model (or --model), in one process, rounds
interleaved so a host's drift hits every variant alike.

    python benchmarks/prompt_logprobs_cost.py --prompt-tokens 512 --rounds 5

Prints the median seconds per variant and its ratio to the plain prefill. The extra work is
the LM head over every prompt row (hidden x vocab per token) plus a float32 log-softmax, top-k
and rank per row, 128 rows at a time.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cadence import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    args = ap.parse_args()
    llm = LLM(args.model, max_num_batched_tokens=args.budget, enable_prefix_caching=False,
              startup_profile=False)
    vocab = llm.get_tokenizer().vocab_size
    ids = [(7 + 31 * i) % (vocab - 100) + 50 for i in range(args.prompt_tokens)]
    variants = {"plain": None, "prompt_logprobs=0": 0, "prompt_logprobs=5": 5,
                "prompt_logprobs=20": 20}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds + 1):
        for name, k in variants.items():
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k)
            t0 = time.perf_counter()
            out = llm.generate([ids], params, use_tqdm=False)[0]
            elapsed = time.perf_counter() - t0
            if k is not None:
                assert len(out.prompt_logprobs) == len(ids)
            if r:  # the first round warms up
                times[name].append(elapsed)
    base = statistics.median(times["plain"])
    print(f"prompt {args.prompt_tokens} tokens, vocab {vocab}, budget {args.budget}, "
          f"{args.rounds} rounds (median):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:20s} {med * 1000:8.1f} ms  x{med / base:.2f}")


if __name__ == "__main__":
    main()
