"""What a prompt chunk costs on this machine, by size and position: why small chunks are slow.

Times executor steps built by hand (as perf_bench.py does): decode-only steps, a prompt chunk of
n tokens at position s alone and with decode rows riding along, and the float32/bf16 flash
prefill attention kernel alone for a chunk at position 0 and continuing a cached context. Prints
ms per step and, per chunk, ms per token after taking the attention kernel's share out, so the
per-token GEMM cost by chunk size and the attention cost per (query, key) pair can be read off:
the two terms the slo policy's prefill floor trades against a step's fixed cost. Run:
    .venv/bin/python benchmarks/chunk_cost.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from perf_bench import BLOCK_SIZE, GREEDY, ModelExecutor, ScheduledChunk, StepPlan

from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.loader import load_model
from cadence.model.prefill_attention import prefill_kernel

CHUNKS = ((16, 1000), (32, 1000), (64, 1000), (128, 1000), (256, 1000), (256, 0), (512, 0))


def median_ms(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def attention_ms_per_layer(loaded, n: int, pos: int, repeats: int) -> float | None:
    """The flash prefill kernel alone: n queries at position pos over a cached context."""
    c = loaded.config
    q = torch.randn(n, c.num_heads, c.head_dim, dtype=loaded.dtype)
    kernel = prefill_kernel(q, load_cpu_kernels())
    if kernel is None:
        return None
    if pos == 0:
        k = torch.randn(n, c.num_kv_heads, c.head_dim, dtype=loaded.dtype)
        return median_ms(lambda: kernel(q, k, torch.randn_like(k), c.head_dim ** -0.5, None, -1), repeats)
    blocks = -(-(pos + n) // BLOCK_SIZE)
    cache = torch.randn(blocks, BLOCK_SIZE, c.num_kv_heads, c.head_dim, dtype=loaded.dtype)
    table = torch.randperm(blocks).to(torch.int32)
    return median_ms(lambda: kernel(q, cache, torch.randn_like(cache), c.head_dim ** -0.5, table, pos + n), repeats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--decodes", type=int, default=3, help="decode rows riding along")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    loaded = load_model(None, dtype="auto")
    layers = loaded.config.num_layers
    executor = ModelExecutor(loaded, num_blocks=400, block_size=BLOCK_SIZE, seed=0)
    executor.kv_cache.storage.normal_(0, 1)
    ctx = 500
    per_seq = ctx // BLOCK_SIZE + 1

    def decode(i: int) -> ScheduledChunk:
        return ScheduledChunk(f"d{i}", (100 + i,), ctx, tuple(range(i * per_seq, (i + 1) * per_seq)),
                              True, GREEDY, 1, is_prefill=False)

    def chunk(n: int, pos: int) -> ScheduledChunk:
        blocks = tuple(range(100, 100 + -(-(pos + n) // BLOCK_SIZE)))
        return ScheduledChunk("p", tuple(range(5, 5 + n)), pos, blocks, True, GREEDY, 0)

    def step_ms(chunks: list[ScheduledChunk]) -> float:
        plan = StepPlan(0, tuple(chunks), BLOCK_SIZE)
        return median_ms(lambda: executor.execute(plan), args.repeats)

    decodes = [decode(i) for i in range(args.decodes)]
    print(f"{loaded.name}, {loaded.dtype}, {loaded.model.decode_weight_format} weights, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}")
    for r in range(args.rounds):
        print(f"round {r + 1}: decode step, 1 row {step_ms(decodes[:1]):.1f} ms, "
              f"{args.decodes} rows {step_ms(decodes):.1f} ms (context {ctx})")
        print(f"  {'chunk':>12s} {'alone':>9s} {'+decodes':>9s} {'attention':>10s} {'ns/pair/layer':>14s} "
              f"{'other ms/token':>15s}")
        for n, pos in CHUNKS:
            alone = step_ms([chunk(n, pos)])
            mixed = step_ms(decodes + [chunk(n, pos)])
            attn = attention_ms_per_layer(loaded, n, pos, args.repeats)
            pairs = n * pos + n * (n + 1) / 2
            attn_total = attn * layers if attn is not None else float("nan")
            print(f"  {n:5d} @ {pos:4d} {alone:8.0f}ms {mixed:8.0f}ms {attn_total:8.0f}ms "
                  f"{(attn or float('nan')) * 1e6 / pairs:14.1f} {(alone - attn_total) / n:15.2f}",
                  flush=True)
    print("attention: the flash prefill kernel alone (x layers); chunks of <= 32 tokens run in the "
          "fused stack, whose attention is the decode kernel's, so 'other' includes it there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
