"""Sliding-window and soft-capped paged attention against a dense reference written from the
definitions: a query at position p sees keys at positions in (p - window, p]; scores are
cap * tanh(s / cap) before the mask."""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention import paged_attention
from cadence.model.attention_metadata import AttentionMetadata

from .paged_helpers import random_sequences_in_pool

HEADS, KV_HEADS, DIM = 4, 2, 8


def dense_reference(q, k, v, scale, window, softcap):
    """q: [L, H, D], k, v: [L, Hkv, D] -> [L, H, D], every query over its visible keys."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [H, L, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    pos = torch.arange(q.shape[0])
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[None, :] > pos[:, None] - window
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window,softcap", [(5, None), (16, None), (None, 0.7), (6, 0.7)])
def test_windowed_and_capped_paged_attention_match_dense(block_size, window, softcap):
    """Three steps over five sequences of different lengths: whole prompts, continuing chunks
    that start past the window, and decodes batched together (each its own window start)."""
    torch.manual_seed(block_size)
    lengths = [37, 9, 22, 3, 30]
    cuts = [(20, 36), (4, 8), (21, 21), (1, 2), (10, 29)]  # step boundaries per sequence
    pool = 128
    qs, ks, vs, k_cache, v_cache, tables = random_sequences_in_pool(
        lengths, HEADS, KV_HEADS, DIM, pool, block_size)
    outputs = [[] for _ in lengths]
    scale = DIM ** -0.5
    for step in range(3):
        spans = [((0, a), (a, b), (b, n))[step] for (a, b), n in zip(cuts, lengths)]
        active = [i for i, (s, e) in enumerate(spans) if e > s]
        meta = AttentionMetadata.build([(spans[i][0], spans[i][1] - spans[i][0], tables[i]) for i in active],
                                       block_size, pool)
        q = torch.cat([qs[i][slice(*spans[i])] for i in active])
        k = torch.cat([ks[i][slice(*spans[i])] for i in active])
        v = torch.cat([vs[i][slice(*spans[i])] for i in active])
        out = paged_attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        for j, i in enumerate(active):
            outputs[i].append(out[meta.query_start_loc_host[j]:meta.query_start_loc_host[j + 1]])
    for i in range(len(lengths)):
        expected = dense_reference(qs[i], ks[i], vs[i], scale, window, softcap)
        torch.testing.assert_close(torch.cat(outputs[i]), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", [64, 256])
@pytest.mark.parametrize("window", [5, 300])
def test_float32_paged_kernel_window_matches_dense_and_each_row_alone(dim, window):
    """The float32 paged kernel with a window (the GGUF stack's and the per-op path's attention
    of sliding layers): rows of a chunk at positions 560-571 of a 600-token sequence (the
    window's start in the attention's third span, tiled rows) and decodes of shorter ones
    (all keys visible, or a window inside the first span), against the dense reference; and
    every row's output bit for bit what it is alone."""
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None or not hasattr(kernels, "kernel_tier") or kernels.kernel_tier() == "torch":
        pytest.skip("needs the compiled CPU kernels")
    torch.manual_seed(dim + window)
    block, pool, heads, kv_heads = 16, 96, 2, 1
    lengths = [600, 40, 4]
    keys = [torch.randn(n, kv_heads, dim) for n in lengths]
    values = [torch.randn(n, kv_heads, dim) for n in lengths]
    k_cache = torch.zeros(pool, block, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(pool).tolist()
    tables = torch.zeros(len(lengths), 40, dtype=torch.int32)
    cursor = 0
    for i, n in enumerate(lengths):
        need = -(-n // block)
        tables[i, :need] = torch.tensor(perm[cursor:cursor + need], dtype=torch.int32)
        cursor += need
        slots = (tables[i, :need].long()[:, None] * block + torch.arange(block)).flatten()[:n]
        k_cache.view(-1, kv_heads, dim)[slots] = keys[i]
        v_cache.view(-1, kv_heads, dim)[slots] = values[i]
    rows = [(0, p) for p in range(560, 572)] + [(1, 39), (2, 3)]  # (sequence, query position)
    q = torch.randn(len(rows), heads, dim)
    seq = torch.tensor([s for s, _ in rows])
    ctx = torch.tensor([p + 1 for _, p in rows])
    scale = dim ** -0.5
    out = kernels.paged_attention(q, k_cache, v_cache, tables, seq, ctx, scale, window)
    for r, (s, p) in enumerate(rows):
        qs = torch.zeros(p + 1, heads, dim)
        qs[p] = q[r]
        expected = dense_reference(qs, keys[s][:p + 1], values[s][:p + 1], scale, window, None)[p]
        torch.testing.assert_close(out[r], expected, atol=1e-5, rtol=1e-5)
        alone = kernels.paged_attention(q[r:r + 1].contiguous(), k_cache, v_cache, tables, seq[r:r + 1],
                                        ctx[r:r + 1], scale, window)
        assert torch.equal(alone[0], out[r])
