"""bf16 causal prefill attention on CPU: the C++ kernel against the torch paths, alternated.

  attention  the attention alone, SmolLM2-135M shapes (9 query heads, 3 KV heads, head_dim 64):
             kernels.prefill_attention vs blocked_causal_attention (bf16 matmuls) vs SDPA, for a
             whole prompt (n = L) and for chunks continuing a context (n < L). GFLOP/s count the
             causal half: 4 * Hq * D * (keys each query sees), summed over queries.
  prefill    whole-model prefill (ModelExecutor, one prompt) with the kernel on and off
             (prefill_kernel patched to None: blocked matmuls >= MIN_CHUNK, SDPA below), whole
             prompts and chunked ones (chunks of --chunks tokens, each over the cached context).

    .venv/bin/python benchmarks/prefill_attention_bench.py                    # both parts
    .venv/bin/python benchmarks/prefill_attention_bench.py --part attention --rounds 7

Every variant runs once per round, in turn, so a busy neighbour slows all of them alike; medians
over rounds. Reports, never asserts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as perf_bench: idle threads sleep

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cadence.model.prefill_attention as pa  # noqa: E402
from cadence.core.plan import ScheduledChunk, StepPlan  # noqa: E402
from cadence.core.sampling_params import SamplingParams  # noqa: E402
from cadence.model.kernels.cpu_ops import load_cpu_kernels  # noqa: E402

BLOCK_SIZE = 16


def alternate(variants: dict[str, Callable[[], object]], rounds: int,
              inner: int) -> dict[str, float]:
    """Median seconds per call of each variant; each round times `inner` calls of every variant."""
    for fn in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(t) for name, t in times.items()}


def sdpa_offset(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float):
    n, ctx = q.shape[0], keys.shape[0]
    heads_first = [x.transpose(0, 1).contiguous().unsqueeze(0) for x in (q, keys, values)]
    if n == ctx:
        return F.scaled_dot_product_attention(*heads_first, is_causal=True, scale=scale,
                                              enable_gqa=True)
    mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    return F.scaled_dot_product_attention(*heads_first, attn_mask=mask, scale=scale,
                                          enable_gqa=True)


def attention_part(args: argparse.Namespace) -> None:
    kernels = load_cpu_kernels()
    if pa.prefill_kernel(torch.zeros(1, 1, 64, dtype=torch.bfloat16), kernels) is None:
        print("prefill kernel unavailable (no compiled kernels or no AVX512-BF16)")
        return
    heads, kv_heads, dim, scale = 9, 3, 64, 0.125
    print(f"attention alone, bf16, Hq {heads}, Hkv {kv_heads}, D {dim}, {torch.get_num_threads()} "
          f"threads, median of {args.rounds} alternated rounds:")
    for n, ctx in ((2048, 2048), (512, 2048), (256, 2048), (512, 512), (256, 256)):
        gen = torch.Generator().manual_seed(n + ctx)
        q = torch.randn(n, heads, dim, generator=gen).bfloat16()
        keys = torch.randn(ctx, kv_heads, dim, generator=gen).bfloat16()
        values = torch.randn(ctx, kv_heads, dim, generator=gen).bfloat16()
        flops = 4 * heads * dim * sum(ctx - n + j + 1 for j in range(n))
        variants = {
            "kernel": lambda: kernels.prefill_attention(q, keys, values, scale, None, -1),
            "blocked": lambda: pa.blocked_causal_attention(q, keys, values, scale),
            "sdpa": lambda: sdpa_offset(q, keys, values, scale),
        }
        inner = max(1, int(2e9 // flops))
        result = alternate(variants, args.rounds, inner)
        cells = "  ".join(f"{name} {s * 1e3:7.2f} ms ({flops / s / 1e9:4.0f} GF/s)"
                          for name, s in result.items())
        print(f"  n {n:5d} L {ctx:5d}: {cells}  kernel "
              f"{result['blocked'] / result['kernel']:.2f}x blocked")


def prefill_part(args: argparse.Namespace) -> None:
    from cadence.executor.model_runner import ModelExecutor
    from cadence.model.loader import load_model

    loaded = load_model(None, dtype=torch.bfloat16, device="cpu")
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    print(f"whole-model bf16 prefill ({loaded.name}), kernel on/off, {torch.get_num_threads()} "
          f"threads, median of {args.rounds} alternated rounds:")
    real_prefill_kernel = pa.prefill_kernel
    for n in args.prompt_lens:
        blocks = -(-n // BLOCK_SIZE)
        executor = ModelExecutor(loaded, num_blocks=blocks, block_size=BLOCK_SIZE, seed=0)
        ids = tuple(torch.randint(3, loaded.config.vocab_size, (n,)).tolist())
        for chunk in [n] + [c for c in args.chunks if c < n]:
            plans = []
            for start in range(0, n, chunk):
                end = min(start + chunk, n)
                table = tuple(range(-(-end // BLOCK_SIZE)))
                sc = ScheduledChunk("p", ids[start:end], start, table, end == n, greedy, 0)
                plans.append(StepPlan(len(plans), (sc,), BLOCK_SIZE))

            def run_plans(on: bool, plans=plans, executor=executor) -> None:
                pa.prefill_kernel = real_prefill_kernel if on else (lambda q, kernels: None)
                try:
                    for plan in plans:
                        executor.execute(plan)
                finally:
                    pa.prefill_kernel = real_prefill_kernel

            with torch.inference_mode():
                result = alternate({"on": lambda: run_plans(True), "off": lambda: run_plans(False)},
                                   args.rounds, 1)
            what = f"prefill {n}" + (f" in chunks of {chunk}" if chunk < n else "")
            on, off = result["on"], result["off"]
            print(f"  {what:<30} kernel on {on * 1e3:8.1f} ms ({n / on:6.0f} tok/s)   "
                  f"off {off * 1e3:8.1f} ms ({n / off:6.0f} tok/s)   {off / on:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("attention", "prefill"), default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--chunks", type=int, nargs="*", default=[256, 512])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.part in (None, "attention"):
        attention_part(args)
    if args.part in (None, "prefill"):
        prefill_part(args)


if __name__ == "__main__":
    main()
