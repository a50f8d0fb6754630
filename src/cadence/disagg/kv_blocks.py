"""A paged KV cache's blocks as byte frames (the sender's views, no copy) and back.

The cache storage is [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
(cadence.model.kv_cache): for one layer and K or V, a run of consecutive block ids is one
contiguous span of memory. A transfer of a block list is therefore one frame per (layer, K|V,
run of consecutive ids), each a view of the cache: ZeroMQ sends it without copying. The header
says how the frames map back, so the receiver can scatter them into its own block ids.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def block_runs(block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """[(first_id, count)] of maximal runs of consecutive ids, in order."""
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


@dataclass(frozen=True)
class KVLayout:
    """What both ends must agree on before bytes mean anything."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # torch dtype name, e.g. "bfloat16"

    @classmethod
    def of(cls, storage: torch.Tensor) -> KVLayout:
        layers, _, _, block_size, heads, dim = storage.shape
        return cls(layers, block_size, heads, dim, str(storage.dtype).removeprefix("torch."))

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def to_dict(self) -> dict:
        return {"num_layers": self.num_layers, "block_size": self.block_size,
                "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "dtype": self.dtype}


def export_frames(storage: torch.Tensor, block_ids: Sequence[int]) -> list[memoryview]:
    """Views of the blocks' bytes, ordered layer, K|V, run (see module docstring); the caller
    keeps the blocks unchanged until the frames are sent."""
    frames = []
    runs = block_runs(block_ids)
    for layer in range(storage.shape[0]):
        for kv in range(2):
            for first, count in runs:
                span = storage[layer, kv, first:first + count]  # contiguous
                frames.append(memoryview(span.view(torch.uint8).numpy()).cast("B"))
    return frames


def import_frames(storage: torch.Tensor, block_ids: Sequence[int], remote_runs: list[list[int]],
                  buffers: Sequence[memoryview]) -> int:
    """Scatter frames exported for `remote_runs` into this cache's `block_ids` (same count, in
    order); returns the bytes written. Raises ValueError when the shapes do not add up."""
    num_layers = storage.shape[0]
    counts = [count for _, count in remote_runs]
    if sum(counts) != len(block_ids):
        raise ValueError(f"{sum(counts)} remote blocks for {len(block_ids)} local blocks")
    if len(buffers) != num_layers * 2 * len(counts):
        raise ValueError(f"{len(buffers)} frames, expected {num_layers * 2 * len(counts)}")
    block_shape = storage.shape[3:]
    index = torch.tensor(list(block_ids), dtype=torch.long)
    frame = iter(buffers)
    written = 0
    with warnings.catch_warnings():
        # The received frames are read-only buffers; they are only read here.
        warnings.simplefilter("ignore", UserWarning)
        for layer in range(num_layers):
            for kv in range(2):
                parts = []
                for count in counts:
                    buf = next(frame)
                    data = torch.frombuffer(buf, dtype=torch.uint8)
                    parts.append(data.view(storage.dtype).view(count, *block_shape))
                    written += data.numel()
                src = parts[0] if len(parts) == 1 else torch.cat(parts)
                storage[layer, kv].index_copy_(0, index, src)
    return written
