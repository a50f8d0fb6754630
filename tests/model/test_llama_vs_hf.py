"""Our LlamaForCausalLM over the paged cache gives transformers' logits (fp32, tiny checkpoints)."""

from __future__ import annotations

import random

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from .paged_helpers import paged_logits, scattered_block_table

TOLERANCE = 1e-4


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


def random_prompt(vocab: int, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


@pytest.mark.parametrize("chunk_size", [1000, 1, 3, 17])
def test_chunked_prefill_matches_transformers(tiny_pair, chunk_size):
    ours, theirs = tiny_pair
    prompt = random_prompt(ours.config.vocab_size, 45, seed=chunk_size)
    expected = hf_logits(theirs, prompt)
    got = paged_logits(ours, prompt, chunk_size, block_size=4, pool_size=32, seed=chunk_size)
    assert got.shape == expected.shape
    assert got.dtype == torch.float32
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, f"max abs diff {diff} with chunk size {chunk_size}"


def test_mixed_batch_of_prefills_and_decodes_matches(tiny_pair):
    """Several sequences in one forward: two prefill chunks (one continuing) and three decodes."""
    ours, theirs = tiny_pair
    block_size, pool = 4, 96
    vocab = ours.config.vocab_size
    prompts = [random_prompt(vocab, n, seed=n) for n in (23, 9, 31, 5, 14)]
    # (already cached tokens, new tokens this step) per sequence.
    split = [(0, 23), (4, 5), (30, 1), (4, 1), (13, 1)]
    kv = KVCache(ours.config, pool, block_size, ours.dtype, ours.device)
    blocks = scattered_block_table(pool, pool, seed=3)
    tables, cursor = [], 0
    for p in prompts:
        need = -(-len(p) // block_size)
        tables.append(blocks[cursor:cursor + need])
        cursor += need
    with torch.inference_mode():
        # Fill each cache with its cached prefix, one sequence at a time.
        for p, (cached, _), table in zip(prompts, split, tables):
            if cached:
                meta = AttentionMetadata.build([(0, cached, table)], block_size, pool)
                ours.model(torch.tensor(p[:cached]), meta.positions, meta, kv)
        meta = AttentionMetadata.build(
            [(cached, new, table) for (cached, new), table in zip(split, tables)], block_size, pool
        )
        ids = torch.tensor([t for p, (c, n) in zip(prompts, split) for t in p[c:c + n]])
        got = ours.model.compute_logits(ours.model(ids, meta.positions, meta, kv))
    row = 0
    for p, (cached, new) in zip(prompts, split):
        expected = hf_logits(theirs, p)[cached:cached + new]
        diff = (got[row:row + new] - expected).abs().max().item()
        assert diff < TOLERANCE, f"sequence of {len(p)} tokens: max abs diff {diff}"
        row += new


def test_bfloat16_stays_close_to_float32(tiny_llama_dir):
    fp32 = load_model(tiny_llama_dir, dtype="float32", device="cpu")
    bf16 = load_model(tiny_llama_dir, dtype="bfloat16", device="cpu")
    assert bf16.dtype == torch.bfloat16
    prompt = random_prompt(fp32.config.vocab_size, 30, seed=5)
    ref = paged_logits(fp32, prompt, 7)
    got = paged_logits(bf16, prompt, 7)
    assert got.dtype == torch.float32  # logits always come out in float32
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"tiny llama bf16 vs fp32: max relative logit error {rel:.4f}")
    assert rel < 0.1
