"""Paged attention against a dense causal reference, KV cache block copies, metadata checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.model.attention import paged_attention
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.config import ModelConfig
from cadence.model.kv_cache import KVCache, kv_bytes_per_block

from .paged_helpers import random_sequences_in_pool

HEADS, KV_HEADS, DIM = 4, 2, 8


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(architecture="llama", vocab_size=32, hidden_size=32, intermediate_size=64,
                  num_layers=2, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM)
    fields.update(overrides)
    return ModelConfig(**fields)


def dense_reference(q, k, v):
    """q: [L, H, D], k, v: [L, Hkv, D] -> causal attention [L, H, D]."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_attention_matches_dense_for_any_chunking(block_size):
    torch.manual_seed(0)
    lengths = [13, 7, 1, 20]
    pool = 64
    qs, ks, vs, k_cache, v_cache, tables = random_sequences_in_pool(
        lengths, HEADS, KV_HEADS, DIM, pool, block_size)
    # Step 1: every sequence but the last token of each; step 2: the rest (decodes + a chunk).
    outputs = [[] for _ in lengths]
    cuts = [max(n - 1, 0) if n > 1 else 0 for n in lengths]
    cuts[3] = 11  # the long one continues with a 9-token chunk
    for step in (0, 1):
        spans = [(0, c) if step == 0 else (c, n) for c, n in zip(cuts, lengths)]
        active = [i for i, (a, b) in enumerate(spans) if b > a]
        meta = AttentionMetadata.build(
            [(spans[i][0], spans[i][1] - spans[i][0], tables[i]) for i in active], block_size, pool)
        q = torch.cat([qs[i][spans[i][0]:spans[i][1]] for i in active])
        k = torch.cat([ks[i][spans[i][0]:spans[i][1]] for i in active])
        v = torch.cat([vs[i][spans[i][0]:spans[i][1]] for i in active])
        out = paged_attention(q, k, v, k_cache, v_cache, meta, DIM ** -0.5)
        for j, i in enumerate(active):
            a, b = meta.query_start_loc_host[j], meta.query_start_loc_host[j + 1]
            outputs[i].append(out[a:b])
    for i in range(len(lengths)):
        expected = dense_reference(qs[i], ks[i], vs[i])
        torch.testing.assert_close(torch.cat(outputs[i]), expected, atol=1e-5, rtol=1e-5)


def test_metadata_positions_and_slots():
    meta = AttentionMetadata.build([(0, 3, [5, 1]), (6, 1, [2, 9])], block_size=4, num_blocks=10)
    assert meta.positions.tolist() == [0, 1, 2, 6]
    assert meta.slot_mapping.tolist() == [20, 21, 22, 9 * 4 + 2]
    assert meta.seq_lens.tolist() == [3, 7]
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.block_tables.tolist() == [[5, 0], [2, 9]]  # first table trimmed to 1 block, padded
    assert meta.prefill_seqs == (0,) and meta.decode_seqs == (1,)
    assert meta.decode_rows.tolist() == [3] and meta.decode_blocks.tolist() == [[2, 9]]
    assert meta.decode_valid.tolist() == [[True] * 7 + [False]]


@pytest.mark.parametrize("chunk, message", [
    ((0, 9, [1, 2]), "need 3"),  # 9 positions need 3 blocks of 4
    ((0, 2, [12]), "outside pool"),
    ((0, 0, [1]), "new tokens > 0"),
    ((-1, 2, [1]), "start_pos >= 0"),
])
def test_metadata_rejects_bad_chunks(chunk, message):
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.build([chunk], block_size=4, num_blocks=10)


def test_kv_cache_layout_and_block_copies():
    config = tiny_config()
    kv = KVCache(config, num_blocks=6, block_size=4, dtype=torch.float32, device="cpu")
    assert kv.k[1].shape == (6, 4, KV_HEADS, DIM)
    kv.k[0][2] = 1.0
    kv.v[1][2] = 2.0
    kv.k[0][3] = 3.0
    kv.copy_blocks([(2, 5), (3, 2)])  # reads happen before writes: 5 gets 2's old contents
    assert torch.all(kv.k[0][5] == 1.0) and torch.all(kv.v[1][5] == 2.0)
    assert torch.all(kv.k[0][2] == 3.0)
    with pytest.raises(ValueError, match="outside pool"):
        kv.copy_blocks([(0, 6)])
    assert kv_bytes_per_block(config, 4, torch.bfloat16) == 2 * 2 * 4 * KV_HEADS * DIM * 2


def test_model_config_validation():
    with pytest.raises(ValueError, match="unsupported architecture"):
        tiny_config(architecture="gpt_neox")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tiny_config(num_kv_heads=3)
