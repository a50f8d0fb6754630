"""Greedy reproducibility and cost per dtype on the default model: 12 prompts sharing a prefix,
run twice (the second run hits the prefix cache, so prompts are split into other chunks).
Prints each run's wall time and how many of the 12 texts differ between the two runs.

    .venv/bin/python benchmarks/greedy_reproducibility.py [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import time

from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model

PREFIX = ("You are a careful assistant. Answer in one short paragraph, plainly, without lists. "
          "Think about what the question really asks before you answer it. ")
QUESTIONS = [
    "Why is the sky blue?", "What is a prime number?", "How do bees make honey?",
    "Why do we have seasons?", "What does a compiler do?", "How does a refrigerator work?",
    "What is photosynthesis?", "Why does ice float on water?", "What causes tides?",
    "How do vaccines work?", "What is inflation in economics?", "Why do cats purr?",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    prompts = [PREFIX + q for q in QUESTIONS]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for dtype in args.dtypes.split(","):
        engine = LLMEngine.from_loaded(load_model(None, dtype=dtype), EngineConfig(dtype=dtype))
        llm = LLM.from_engine(engine)
        t0 = time.perf_counter()
        first = [r.text for r in llm.generate(prompts, params)]
        t1 = time.perf_counter()
        second = [r.text for r in llm.generate(prompts, params)]
        t2 = time.perf_counter()
        differ = sum(a != b for a, b in zip(first, second))
        print(f"{dtype}: run 1 {t1 - t0:.1f} s, run 2 (prefix hits) {t2 - t1:.1f} s; "
              f"{differ}/{len(prompts)} texts differ between the runs", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
