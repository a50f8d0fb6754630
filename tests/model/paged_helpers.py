"""Helpers for model tests: run token chunks through the paged cache with scattered blocks."""

from __future__ import annotations

import random

import torch

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
