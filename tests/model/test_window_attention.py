"""Sliding-window and soft-capped paged attention against a dense reference written from the
definitions: a query at position p sees keys at positions in (p - window, p]; scores are
cap * tanh(s / cap) before the mask."""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention import paged_attention
from cadence.model.attention_metadata import AttentionMetadata

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
    qs = [torch.randn(n, HEADS, DIM) for n in lengths]
    ks = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    vs = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    pool = 128
    k_cache = torch.zeros(pool, block_size, KV_HEADS, DIM)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(pool).tolist()
    tables, cursor = [], 0
    for n in lengths:
        need = -(-n // block_size)
        tables.append(perm[cursor:cursor + need])
        cursor += need
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
