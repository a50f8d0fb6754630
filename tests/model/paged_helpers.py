"""Helpers for model tests: run token chunks through the paged cache with scattered blocks."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.kv_cache import KVCache
from cadence.model.loader import LoadedModel


def scattered_block_table(num_blocks_needed: int, pool_size: int, seed: int) -> list[int]:
    """Distinct, non-contiguous, out-of-order blocks (e.g. [7, 2, 11, 4, ...])."""
    blocks = list(range(pool_size))
    random.Random(seed).shuffle(blocks)
    return blocks[:num_blocks_needed]


def paged_logits(loaded: LoadedModel, token_ids: list[int], chunk_size: int, block_size: int = 4,
                 pool_size: int = 64, seed: int = 0) -> torch.Tensor:
    """Logits [len(token_ids), V] computed chunk by chunk through a fresh paged cache."""
    model = loaded.model
    kv = KVCache(loaded.config, pool_size, block_size, loaded.dtype, loaded.device)
    table = scattered_block_table(-(-len(token_ids) // block_size), pool_size, seed)
    rows = []
    with torch.inference_mode():
        for start in range(0, len(token_ids), chunk_size):
            chunk = token_ids[start:start + chunk_size]
            meta = AttentionMetadata.build([(start, len(chunk), table)], block_size, pool_size)
            hidden = model(torch.tensor(chunk), meta.positions, meta, kv)
            rows.append(model.compute_logits(hidden))
    return torch.cat(rows)


def offset_causal_sdpa(q, keys, values, scale, dtype=torch.float32):
    """Reference attention in `dtype`: q [n, Hq, D] over keys/values [L, Hkv, D], query j at
    position L - n + j seeing keys [0, L - n + j]."""
    n, ctx = q.shape[0], keys.shape[0]
    mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    return F.scaled_dot_product_attention(
        q.to(dtype).transpose(0, 1)[None], keys.to(dtype).transpose(0, 1)[None],
        values.to(dtype).transpose(0, 1)[None], attn_mask=mask, scale=scale,
        enable_gqa=True)[0].transpose(0, 1)


def cache_slots(table, block_size, length):
    """The flat cache slots of positions [0, length) under a block table."""
    return (table[:, None].long() * block_size + torch.arange(block_size)).flatten()[:length]


def scatter_to_cache(x, block_size, gen):
    """x [L, Hkv, D] into a cache [num_blocks, block_size, Hkv, D] of random filler through a
    shuffled block table (one spare block): (cache, table int32)."""
    count = -(-x.shape[0] // block_size)
    table = torch.randperm(count + 1, generator=gen)[:count].to(torch.int32)
    cache = torch.randn(count + 1, block_size, *x.shape[1:], generator=gen).to(x.dtype)
    cache.view(-1, *x.shape[1:])[cache_slots(table, block_size, x.shape[0])] = x
    return cache, table


def bad_prefill_attention_calls(dtype):
    """(error message pattern, arguments) of calls the prefill attention kernels of `dtype`
    (bf16: prefill_attention, float32: prefill_attention_f32) must refuse."""
    q, kv = torch.zeros(4, 4, 64, dtype=dtype), torch.zeros(8, 2, 64, dtype=dtype)
    cache, table = torch.zeros(3, 4, 2, 64, dtype=dtype), torch.tensor([2, 0], dtype=torch.int32)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    return [
        ("bfloat16" if dtype == torch.bfloat16 else "float32", (q.to(other), kv, kv, 1.0, None, -1)),
        ("head_dim 64 or 128", (q[..., :32], kv[..., :32], kv[..., :32], 1.0, None, -1)),
        ("differ in head_dim", (q, kv[..., :32], kv[..., :32], 1.0, None, -1)),
        ("multiple of KV heads", (torch.zeros(4, 3, 64, dtype=dtype), kv, kv, 1.0, None, -1)),
        ("shorter than the chunk", (torch.zeros(9, 4, 64, dtype=dtype), kv, kv, 1.0, None, -1)),
        ("differ in shape", (q, kv, kv[:7], 1.0, None, -1)),
        ("q \\[n, Hq, D\\]", (q[0], kv, kv, 1.0, None, -1)),
        ("ctx_len", (q, kv, kv, 1.0, None, 5)),
        ("out of range", (q, cache, cache, 1.0, torch.tensor([2, 3], dtype=torch.int32), 8)),
        ("shorter than ctx_len", (q, cache, cache, 1.0, table, 9)),
        ("1-D int32", (q, cache, cache, 1.0, table.long(), 8)),
        ("caches", (q, kv, kv, 1.0, table, 8)),
    ]


def random_sequences_in_pool(lengths, heads, kv_heads, dim, pool, block_size):
    """Random q [n, heads, dim], k/v [n, kv_heads, dim] per sequence, an empty paged cache pair
    [pool, block_size, kv_heads, dim] and each sequence's block table, drawn from one shuffled
    pool (so tables are scattered and disjoint). Uses torch's global generator: seed it first."""
    qs = [torch.randn(n, heads, dim) for n in lengths]
    ks = [torch.randn(n, kv_heads, dim) for n in lengths]
    vs = [torch.randn(n, kv_heads, dim) for n in lengths]
    k_cache = torch.zeros(pool, block_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(pool).tolist()
    tables, cursor = [], 0
    for n in lengths:
        need = -(-n // block_size)
        tables.append(perm[cursor:cursor + need])
        cursor += need
    return qs, ks, vs, k_cache, v_cache, tables
