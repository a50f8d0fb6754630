"""Gather-free paged attention on CPU, through the compiled kernels (cadence.model.kernels).

Decodes (and short prefill chunks that continue a cached context) go to one C++ call that reads
K/V straight from the paged cache through the block tables: nothing is gathered or copied, and
one call serves the whole batch, so no Python work grows with the batch size. bf16 and float32
prefill chunks (from position 0, or continuing a context with at least KERNEL_MIN_CONTINUING new
tokens) go to a C++ causal flash-attention kernel (cadence.model.prefill_attention), which reads a
cached context through the block table. Other prefill chunks that start at position 0 attend only over
their own new keys/values, which are already at hand, so they use torch's SDPA on those without
touching the cache (long bf16 chunks without the kernel: blocked matmuls); long chunks that
continue a context gather it once and use SDPA with an offset mask.

float32 on the AVX2 tiers and above (the default model's compute dtype there) is the exception:
every row, decode or prompt, goes through the paged decode kernel (one query row over its own
context, spans cut at absolute positions, avx2/attention_f32.h), the kernel the fused decode
stack runs for all of its rows. A token's attention is then the same arithmetic whether its
step held it as a decode, in a short chunk of the stack, in a long prompt chunk of the per-op
path, after a prefix-cache hit or in a recompute after preemption: greedy results are
batch-invariant by construction (docs/ARCHITECTURE.md, invariant 1). The flash prefill kernel
would tile keys per stacked rows with its own online softmax order.

The caller has already written this step's K/V into the cache (kernels.rope_write_kv).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.prefill_attention import F32_KERNEL_TIERS, blocked_over_context, takes_blocked

# A continuing prefill chunk with at most this many new tokens runs through the kernel (one query
# row each, over its own context) rather than gather + SDPA.
KERNEL_MAX_CHUNK = 32
# Head dims of the float32 paged kernel (avx2/attention_f32.h: f32_head_dim); Gemma 3's 256 too.
F32_PAGED_HEAD_DIMS = (64, 128, 256)


def paged_attention_cpu(kernels: ModuleType, q: torch.Tensor, k_new: torch.Tensor,
                        v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float, window: int | None = None) -> torch.Tensor:
    """Causal attention of every new token over its sequence's context.

    q: [T, Hq, D] contiguous; k_new, v_new: [T, Hkv, D] (views of this step's new keys/values,
    already stored in the caches); caches: [num_blocks, block_size, Hkv, D], in q's dtype or,
    under float32 compute, float16 / bf16. Returns [T, Hq, D].
    window: a sliding-window layer's window where it excludes keys of some row this step (a
    query at position p sees keys > p - window); only where rows_share_decode_kernel.
    """
    if rows_share_decode_kernel(q, kernels):
        # Every row over its own context [0, position] (or its window of it): one call for the step.
        return kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.row_seq_index,
                                       meta.row_ctx_lens, scale, window or 0)
    if window is not None:
        raise ValueError("a window that excludes keys needs the float32 paged kernel")
    out = torch.empty_like(q)
    if meta.prefill_seqs and k_cache.dtype != q.dtype:
        # A 16-bit cache under float32 compute: a chunk from position 0 attends over its own
        # keys/values as the cache holds them (rounded, as rope_write_kv / write_kv stored
        # them), the values every later chunk and decode reads; unrounded, a prompt's attention
        # would depend on where it was chunked. [T, Hkv, D], once per layer.
        k_new = k_new.to(k_cache.dtype).to(q.dtype)
        v_new = v_new.to(v_cache.dtype).to(q.dtype)
    if meta.decode_seqs:
        # q[decode_rows]: [B, Hq, D]; one call for the whole decode batch.
        rows = meta.decode_rows
        all_decode = len(meta.decode_seqs) == q.shape[0]
        q_dec = q if all_decode else q[rows]
        attn = kernels.paged_attention(q_dec, k_cache, v_cache, meta.block_tables,
                                       meta.decode_seq_index, meta.decode_ctx_lens, scale)
        if all_decode:
            return attn
        out[rows] = attn
    for i in meta.prefill_seqs:
        q_start, q_end = meta.query_start_loc_host[i], meta.query_start_loc_host[i + 1]
        start_pos, seq_len = meta.start_pos_host[i], meta.seq_lens_host[i]
        n_new = q_end - q_start
        if takes_blocked(q, n_new, start_pos, kernels):  # C++ flash kernels / bf16 blocked matmuls
            out[q_start:q_end] = blocked_over_context(q[q_start:q_end], k_new[q_start:q_end],
                                                      v_new[q_start:q_end], k_cache, v_cache,
                                                      meta, i, scale, kernels)
        elif start_pos == 0:
            out[q_start:q_end] = _sdpa_causal(q[q_start:q_end], k_new[q_start:q_end],
                                              v_new[q_start:q_end], scale)
        elif n_new <= KERNEL_MAX_CHUNK:
            # Row j sits at position start_pos + j and sees positions [0, start_pos + j].
            ctx = torch.arange(start_pos + 1, seq_len + 1, dtype=torch.int64)
            seq = torch.full((n_new,), i, dtype=torch.int64)
            out[q_start:q_end] = kernels.paged_attention(
                q[q_start:q_end].contiguous(), k_cache, v_cache, meta.block_tables, seq, ctx, scale)
        else:
            out[q_start:q_end] = _sdpa_over_cache(q[q_start:q_end], k_cache, v_cache, meta, i, scale)
    return out


def rows_share_decode_kernel(q: torch.Tensor, kernels: ModuleType) -> bool:
    """Whether every row of q (float32 on an AVX2-or-better build, head_dim 64, 128 or 256) goes
    through the paged decode kernel, the fused float32 stacks' attention (module docstring)."""
    return (q.dtype == torch.float32 and q.shape[-1] in F32_PAGED_HEAD_DIMS
            and hasattr(kernels, "kernel_tier") and kernels.kernel_tier() in F32_KERNEL_TIERS)


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, Hq, D], k, v: [n, Hkv, D] -> causal attention [n, Hq, D] (the chunk is the context)."""
    # Head-major contiguous copies ([1, heads, n, D]): CPU flash attention runs ~1.5x faster on
    # them than on strided views, far more than the copies cost.
    def heads_first(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).contiguous().unsqueeze(0)

    attn = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v),
                                          is_causal=q.shape[0] > 1, scale=scale, enable_gqa=True)
    return attn.squeeze(0).transpose(0, 1)  # [n, Hq, D]


def _sdpa_over_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     meta: AttentionMetadata, i: int, scale: float) -> torch.Tensor:
    """A long chunk continuing a cached context: gather the context once, SDPA with offset mask."""
    start_pos, seq_len = meta.start_pos_host[i], meta.seq_lens_host[i]
    blocks = meta.block_tables[i, : meta.num_blocks_host[i]]
    # cache[blocks]: [n_blocks, block_size, Hkv, D] -> [1, Hkv, seq_len, D]
    keys = k_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0).to(q.dtype)
    values = v_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0).to(q.dtype)
    q_pos = torch.arange(start_pos, seq_len, device=q.device)
    k_pos = torch.arange(seq_len, device=q.device)
    mask = k_pos[None, :] <= q_pos[:, None]  # [n_new, seq_len]
    attn = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys, values,
                                          attn_mask=mask, scale=scale, enable_gqa=True)
    return attn.squeeze(0).transpose(0, 1)
