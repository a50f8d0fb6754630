"""Mixture-of-experts step cost: a Qwen3-MoE shape (64 experts, top 8, expert width 256, hidden
1024, 4 layers) against its dense Qwen3 twin whose MLP is as wide as a token's 8 experts
together (2048): the same active multiply-adds per token, both on the per-op path (Qwen3's q/k
norms keep the dense twin off the fused stack too), float32 compute on int8 weights. Random
weights; decode step (b1, b8 at context 128, medians) and a 512-token prefill.

    PYTHONPATH=src .venv/bin/python benchmarks/moe_bench.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cadence.model.attention_metadata import AttentionMetadata  # noqa: E402
from cadence.model.kv_cache import KVCache  # noqa: E402
from cadence.model.loader import load_model  # noqa: E402
from tests.conftest import build_tiny_tokenizer  # noqa: E402

BLOCK = 16


def build(kind: str, layers: int) -> str:
    folder = tempfile.mkdtemp()
    vocab = build_tiny_tokenizer(folder)
    common = dict(vocab_size=vocab, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                  num_hidden_layers=layers, max_position_embeddings=4096, tie_word_embeddings=False,
                  intermediate_size=2048)
    if kind == "moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **common, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256, norm_topk_prob=True))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    model.save_pretrained(folder)
    return folder


def decode_ms(loaded, rows: int, ctx: int, reps: int) -> float:
    """Median time of a decode step of `rows` sequences at context `ctx` (logits included)."""
    pool = 2048
    kv = KVCache(loaded.config, pool, BLOCK, loaded.dtype, loaded.device)
    per = -(-(ctx + reps + 1) // BLOCK)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(rows)]
    gen = torch.Generator().manual_seed(0)
    times = []
    with torch.inference_mode():
        for table in tables:
            meta = AttentionMetadata.build([(0, ctx, table)], BLOCK, pool)
            loaded.model(torch.randint(3, 390, (ctx,), generator=gen), meta.positions, meta, kv)
        for r in range(reps):
            meta = AttentionMetadata.build([(ctx + r, 1, t) for t in tables], BLOCK, pool)
            ids = torch.randint(3, 390, (rows,), generator=gen)
            start = time.perf_counter()
            loaded.model.compute_logits(loaded.model(ids, meta.positions, meta, kv))
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def prefill_ms(loaded, tokens: int) -> float:
    pool = 512
    kv = KVCache(loaded.config, pool, BLOCK, loaded.dtype, loaded.device)
    meta = AttentionMetadata.build([(0, tokens, list(range(-(-tokens // BLOCK))))], BLOCK, pool)
    ids = torch.randint(3, 390, (tokens,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        loaded.model(ids, meta.positions, meta, kv)  # warm-up
        start = time.perf_counter()
        loaded.model(ids, meta.positions, meta, kv)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quantization", default="int8")
    args = parser.parse_args()
    torch.manual_seed(0)
    for kind in ("dense", "moe"):
        loaded = load_model(build(kind, args.layers), dtype="float32", device="cpu", quantization=args.quantization)
        loaded.model.prepare_fast_path()
        b1, b8, pf = decode_ms(loaded, 1, 128, 21), decode_ms(loaded, 8, 128, 11), prefill_ms(loaded, 512)
        print(f"{kind}: decode b1 {b1:.1f} ms, b8 {b8:.1f} ms; prefill 512 {pf:.0f} ms ({512e3 / pf:.0f} tok/s)",
              flush=True)


if __name__ == "__main__":
    main()
