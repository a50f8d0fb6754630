"""Paged attention in plain torch: write new K/V through slot_mapping, read context by block table.

Correct first: prefill chunks run one SDPA call per sequence (an explicit causal-offset mask when
the chunk starts after position 0). Single-token decodes are batched into one padded, masked
attention over all of them, written as two batched matmuls: a decode step of many sequences would
otherwise be one tiny call per sequence per layer, and torch's CPU SDPA kernel is many times
slower than plain matmuls for one query row with a mask.

Two per-layer pieces of some families live here too (the compiled CPU kernels lack them, so the
kernel path sends such layers here): a sliding window (a query at position p sees keys at
positions > p - window, HF's sliding_window_overlay) and tanh soft-capping of the scaled scores
(Gemma 2: cap * tanh(s / cap) before the mask, as HF's eager attention). Soft-capped prefill
chunks compute their scores explicitly (SDPA has no hook for it); softmax runs in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cadence.model.attention_metadata import AttentionMetadata


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new keys/values at their slots.

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; k, v: [T, num_kv_heads,
    head_dim]; slot_mapping: [T] (slot = block * block_size + offset).
    """
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather_context(cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows of the given blocks, in order, in the compute dtype (a float16 / bf16 cache
    under float32 queries is widened): [..., n_blocks * block_size, kv_heads, head_dim]."""
    # cache[blocks]: [..., n_blocks, block_size, kv_heads, head_dim]
    gathered = cache[blocks]
    return gathered.flatten(-4, -3).to(dtype)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole cached context.

    q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] (this step's new tokens, written
    into the cache first); returns [T, num_heads, head_dim]. window: keys at positions
    > p - window only (None: all); softcap: scores become softcap * tanh(scores / softcap).
    """
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    return cached_attention(q, k_cache, v_cache, meta, scale, window, softcap)


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     meta: AttentionMetadata, scale: float, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """paged_attention once this step's K/V are in the caches: q [T, Hq, D] -> [T, Hq, D]."""
    out = torch.empty_like(q)
    if meta.decode_seqs:
        _decode_batch(q, k_cache, v_cache, meta, scale, out, window, softcap)
    for i in meta.prefill_seqs:
        _prefill_one(q, k_cache, v_cache, meta, i, scale, out, window, softcap)
    return out


def _capped_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor, scale: float, softcap: float) -> torch.Tensor:
    """query [1, Hq, n, D], keys/values [1, Hkv, L, D], mask [n, L] bool -> [1, Hq, n, D]:
    HF's eager attention with soft-capped scores."""
    group = query.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scale  # [1, Hq, n, L]
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values)


def _prefill_one(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, i: int, scale: float, out: torch.Tensor,
                 window: int | None = None, softcap: float | None = None) -> None:
    q_start, q_end = meta.query_start_loc_host[i], meta.query_start_loc_host[i + 1]
    start_pos, seq_len = meta.start_pos_host[i], meta.seq_lens_host[i]
    # With a window, blocks wholly before the first query's window are never read.
    first = max(0, start_pos - window + 1) // meta.block_size if window is not None else 0
    blocks = meta.block_tables[i, first: meta.num_blocks_host[i]]
    offset = first * meta.block_size  # position of the first gathered key
    # keys/values: [seq_len - offset, kv_heads, head_dim] -> [1, kv_heads, seq_len - offset, head_dim]
    keys = _gather_context(k_cache, blocks, q.dtype)[:seq_len - offset].transpose(0, 1).unsqueeze(0)
    values = _gather_context(v_cache, blocks, q.dtype)[:seq_len - offset].transpose(0, 1).unsqueeze(0)
    query = q[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, heads, n_new, head_dim]
    n_new = q_end - q_start
    if window is not None or softcap is not None:
        q_pos = torch.arange(start_pos, seq_len, device=q.device)
        k_pos = torch.arange(offset, seq_len, device=q.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [n_new, seq_len - offset]
        if window is not None:
            mask &= k_pos[None, :] > q_pos[:, None] - window
        if softcap is not None:
            attn = _capped_attention(query, keys, values, mask, scale, softcap)
        else:
            attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale,
                                                  enable_gqa=True)
    elif start_pos == 0:
        # The chunk is the whole context: plain causal (top-left aligned == bottom-right here).
        attn = F.scaled_dot_product_attention(query, keys, values, is_causal=n_new > 1,
                                              scale=scale, enable_gqa=True)
    else:
        # Query j sits at position start_pos + j and may see cache positions <= its own.
        q_pos = torch.arange(start_pos, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [n_new, seq_len]
        attn = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    out[q_start:q_end] = attn.squeeze(0).transpose(0, 1)


def _decode_batch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, out: torch.Tensor,
                  window: int | None = None, softcap: float | None = None) -> None:
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads  # query heads per KV head: head h reads KV head h // group
    batch = len(meta.decode_seqs)
    if window is not None:
        blocks, valid = _window_blocks(meta, window)
    else:
        # Padding blocks (and the tail of the last block) are masked out.
        blocks, valid = meta.decode_blocks, meta.decode_valid  # [B, n_blocks], [B, L]
    # keys: [B, L, kv_heads, D] -> [B, kv_heads, D, L]; values -> [B, kv_heads, L, D]
    keys = _gather_context(k_cache, blocks, q.dtype).permute(0, 2, 3, 1)
    values = _gather_context(v_cache, blocks, q.dtype).transpose(1, 2)
    query = q[meta.decode_rows].view(batch, num_kv_heads, group, head_dim)  # [B, kv_heads, G, D]
    scores = torch.matmul(query, keys).float() * scale  # [B, kv_heads, G, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    attn = torch.matmul(probs, values)  # [B, kv_heads, G, D]
    out[meta.decode_rows] = attn.reshape(batch, num_heads, head_dim)


def _window_blocks(meta: AttentionMetadata, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The decodes' blocks from the first one their window reaches ([B, W] int64, padded by
    repeating a row's last block) and which gathered positions they see ([B, W * block_size]
    bool): the decode at position ctx - 1 sees keys in [ctx - window, ctx). Only the window's
    blocks are read, however long the context."""
    bs = meta.block_size
    ctx = meta.decode_ctx_lens  # [B]
    first = (ctx - window).clamp(min=0) // bs  # [B] first block holding a visible key
    last = (ctx - 1) // bs  # [B] block of the decode's own key
    width = int((last - first).max().item()) + 1
    idx = torch.minimum(first[:, None] + torch.arange(width, device=ctx.device)[None, :], last[:, None])
    tables = meta.block_tables[meta.decode_seq_index].to(torch.int64)  # [B, max_blocks]
    blocks = torch.gather(tables, 1, idx)  # [B, W]
    pos = first[:, None] * bs + torch.arange(width * bs, device=ctx.device)[None, :]  # [B, W * bs]
    valid = (pos < ctx[:, None]) & (pos >= ctx[:, None] - window)
    return blocks, valid
