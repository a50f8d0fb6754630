"""cadence: an LLM inference server that keeps every stream smooth when long prompts arrive."""

import os as _os

__version__ = "0.1.0"

# Idle OpenMP threads must sleep, not spin: with a busy neighbour process on one of the two
# cores, spinning pools made decode steps 10-40x slower (benchmarks/perf_bench.py
# --busy-neighbour). libgomp reads this once, when torch loads; every cadence entry point imports
# this package before torch. An explicit setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch's CPU allocator backs allocations of 2 MB and more with transparent huge pages
# (madvise) when this is set, also read when torch loads. The KV pool's blocks are scattered, so
# attention over 4 KB pages missed the TLB every few positions: decode at batch 1 (context 512)
# ran 12% faster with huge pages (paired A/B, Zen 3: 12.8-12.9 vs 14.2-14.9 ms a step).
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def __getattr__(name):
    # Lazy so that `import cadence.core` never pulls torch (core must stay torch-free).
    if name == "LLM":
        from cadence.engine.llm import LLM

        return LLM
    if name in ("SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams",
                "RequestOutputKind"):
        from cadence.core import sampling_params

        return getattr(sampling_params, name)
    if name in ("RequestOutput", "CompletionOutput", "Logprob", "RequestMetrics"):
        from cadence.engine import llm_outputs

        return getattr(llm_outputs, name)
    raise AttributeError(name)
