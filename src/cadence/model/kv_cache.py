"""KVCache: the paged key/value pool that attention reads and writes through block tables."""

from __future__ import annotations

import torch

from cadence.model.config import ModelConfig


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers (K and V): what the engine divides memory by."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element_size


class KVCache:
    """Keys and values of every layer in fixed-size blocks.

    One tensor holds everything so that copying a block (copy-on-write) is one op for all layers:
    storage: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]. `k[layer]` and
    `v[layer]` are views of shape [num_blocks, block_size, num_kv_heads, head_dim]; slot s is
    block s // block_size, offset s % block_size.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.storage = torch.zeros(
            config.num_layers, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim,
            dtype=dtype, device=self.device,
        )
        self.k = tuple(self.storage[layer, 0] for layer in range(config.num_layers))
        self.v = tuple(self.storage[layer, 1] for layer in range(config.num_layers))

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def copy_blocks(self, copies: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> None:
        """Copy whole blocks src -> dst in every layer (before a forward that writes into dst)."""
        if not copies:
            return
        for src, dst in copies:
            if not (0 <= src < self.num_blocks and 0 <= dst < self.num_blocks):
                raise ValueError(f"block copy {src}->{dst} outside pool of {self.num_blocks} blocks")
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        # Gather first, then scatter, so chains like (a->b, b->c) read the pre-copy contents.
        self.storage[:, :, dst] = self.storage[:, :, src]
