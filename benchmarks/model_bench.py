"""Model microbenchmark: prefill throughput and one-step decode latency, next to hardware floors.

Prints, for each dtype: tokens/s of one 2048-token prefill (logits for the last row only, as the
engine asks), and the latency of one decode step (forward + greedy sample) at batch 1, 8, 32 with
every sequence at context 512 or 2048. The floors are what this machine's measured memory
bandwidth and GEMM rates allow: decode must stream every weight (plus the KV it attends over)
once per step; prefill is bounded by matmul FLOPs.

    .venv/bin/python benchmarks/model_bench.py [--model PATH] [--dtypes float32 bfloat16]

Numbers are noisy on shared cores; this script reports, it never asserts.
"""

from __future__ import annotations

import argparse

import torch

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.model_runner import ModelExecutor
from cadence.model.kv_cache import kv_bytes_per_block
from cadence.model.loader import LoadedModel, load_model

from _common import median_time

BLOCK_SIZE = 16
MEMORY_BANDWIDTH = 44e9  # bytes/s, measured stream bandwidth of the 2-core dev machine
GEMM_FLOPS = {torch.bfloat16: 380e9, torch.float32: 165e9}  # measured 2-thread GEMM rates
GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


def matmul_params(loaded: LoadedModel) -> int:
    """Parameters that take part in a matmul per token (everything but embeddings and norms)."""
    c = loaded.config
    per_layer = c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
    per_layer += 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * per_layer


def weight_bytes(loaded: LoadedModel) -> int:
    """Bytes a decode step streams: all layer weights plus the LM head (tied or not)."""
    element = torch.empty((), dtype=loaded.dtype).element_size()
    c = loaded.config
    return (matmul_params(loaded) + c.vocab_size * c.hidden_size) * element


def bench_prefill(loaded: LoadedModel, prompt_len: int, repeats: int) -> tuple[float, float]:
    """(measured tokens/s, floor tokens/s) for one whole-prompt prefill."""
    blocks = -(-prompt_len // BLOCK_SIZE)
    executor = ModelExecutor(loaded, num_blocks=blocks, block_size=BLOCK_SIZE, seed=0)
    ids = tuple(torch.randint(3, loaded.config.vocab_size, (prompt_len,)).tolist())
    chunk = ScheduledChunk("p", ids, 0, tuple(range(blocks)), True, GREEDY, 0)
    plan = StepPlan(0, (chunk,), BLOCK_SIZE)
    seconds = median_time(lambda: executor.execute(plan), repeats)
    c = loaded.config
    flops = 2 * matmul_params(loaded) * prompt_len
    flops += 2 * 2 * c.num_layers * c.q_size * prompt_len * prompt_len / 2  # causal QK^T and PV
    flops += 2 * c.hidden_size * c.vocab_size  # one logits row
    return prompt_len / seconds, prompt_len / (flops / GEMM_FLOPS.get(loaded.dtype, 165e9))


def bench_decode(loaded: LoadedModel, batch: int, context: int, repeats: int) -> tuple[float, float]:
    """(measured seconds, floor seconds) for one decode step of `batch` sequences at `context`.

    All sequences read the same (random) context blocks so the pool stays small, and each owns
    its last block so their new K/V land in distinct slots; attention work is the same as with
    private blocks.
    """
    shared = context // BLOCK_SIZE
    executor = ModelExecutor(loaded, num_blocks=shared + batch, block_size=BLOCK_SIZE, seed=0)
    executor.kv_cache.storage.normal_(0, 1)
    chunks = tuple(
        ScheduledChunk(f"d{i}", (100 + i,), context, tuple(range(shared)) + (shared + i,), True,
                       GREEDY, 1, is_prefill=False)
        for i in range(batch)
    )
    plan = StepPlan(0, chunks, BLOCK_SIZE)
    seconds = median_time(lambda: executor.execute(plan), repeats)
    kv_read = batch * context * kv_bytes_per_block(loaded.config, 1, loaded.dtype)
    return seconds, (weight_bytes(loaded) + kv_read) / MEMORY_BANDWIDTH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, block_size {BLOCK_SIZE}")
    for dtype in args.dtypes:
        loaded = load_model(args.model, dtype=dtype, device="cpu")
        print(f"\n== {loaded.name} {dtype}: {weight_bytes(loaded) / 1e6:.0f} MB streamed per decode step")
        with torch.inference_mode():
            tps, floor = bench_prefill(loaded, args.prompt_len, max(1, args.repeats // 2))
            print(f"prefill {args.prompt_len} tokens: {tps:8.0f} tok/s   (floor {floor:6.0f} tok/s "
                  f"from {GEMM_FLOPS.get(loaded.dtype, 165e9) / 1e9:.0f} GFLOP/s GEMM)")
            for context in args.contexts:
                for batch in args.batches:
                    seconds, floor = bench_decode(loaded, batch, context, args.repeats)
                    print(f"decode batch {batch:3d} context {context:5d}: {seconds * 1e3:8.2f} ms/step "
                          f"{batch / seconds:8.1f} tok/s   (floor {floor * 1e3:6.2f} ms at "
                          f"{MEMORY_BANDWIDTH / 1e9:.0f} GB/s)")
        del loaded


if __name__ == "__main__":
    main()
