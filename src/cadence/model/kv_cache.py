"""KVCache: the paged key/value pool that attention reads and writes through block tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from cadence.model.config import ModelConfig

if TYPE_CHECKING:
    from cadence.model.loader import LoadedModel


# --kv-cache-dtype names -> storage dtypes ("auto" resolves by the checkpoint: auto_kv_cache_dtype).
_NAMED = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_16BIT = (torch.float16, torch.bfloat16)
# What a 16-bit cache may sit under: float32 compute widens float16 / bf16 K/V in registers (the
# CPU kernels, or a cast in the torch path); bf16 compute keeps a bf16 cache (its kernels read
# only that).
_STORABLE = {torch.float32: (torch.float32, *_16BIT),
             torch.bfloat16: (torch.bfloat16,), torch.float16: (torch.float16,)}


def auto_kv_cache_dtype(model_dtype: torch.dtype, checkpoint_format: str = "",
                        checkpoint_dtype: torch.dtype | None = None) -> torch.dtype:
    """--kv-cache-dtype auto: the cache a llama.cpp or vLLM user of the same checkpoint gets.
    16-bit compute keeps its own dtype. Under float32 compute (every GGUF file on CPU, float
    checkpoints on CPUs without native bf16): a GGUF file -> float16 (llama.cpp's default KV
    type); a Hugging Face checkpoint stored in float16 / bf16 -> that dtype (vLLM's `auto`, the
    model's dtype); a float32 checkpoint, or one of unknown origin (a model built in memory) ->
    float32. A 16-bit cache halves the pool's bytes per token and, with the kernels widening K/V
    in registers, ran decode b32 ctx512 1.07-1.26x faster (docs/performance.md)."""
    if model_dtype != torch.float32:
        return model_dtype
    if checkpoint_format == "gguf":
        return torch.float16
    if checkpoint_format == "hf" and checkpoint_dtype in _16BIT:
        return checkpoint_dtype
    return torch.float32


def kv_cache_dtype(name: str, model_dtype: torch.dtype, checkpoint_format: str = "",
                   checkpoint_dtype: torch.dtype | None = None) -> torch.dtype:
    """The KV cache's storage dtype for --kv-cache-dtype `name` under a model computing in
    `model_dtype`, loaded from a `checkpoint_format` ("gguf", "hf" or "" unknown) checkpoint
    whose float tensors are stored in `checkpoint_dtype` (auto_kv_cache_dtype); ValueError for
    a pair the attention paths do not serve."""
    if name == "auto":
        return auto_kv_cache_dtype(model_dtype, checkpoint_format, checkpoint_dtype)
    if name not in _NAMED:
        raise ValueError(f"kv_cache_dtype={name!r}: use auto, {', '.join(_NAMED)}")
    dtype = _NAMED[name]
    if dtype not in _STORABLE.get(model_dtype, (model_dtype,)):
        model = str(model_dtype).removeprefix("torch.")
        raise ValueError(f"kv_cache_dtype={name} is not supported with a {model} model: a "
                         f"{model} model's KV cache is {model} (use 'auto'); float16/bfloat16 "
                         "caches serve float32 models")
    return dtype


def loaded_kv_cache_dtype(name: str, loaded: LoadedModel) -> torch.dtype:
    """kv_cache_dtype for a LoadedModel (its compute dtype and checkpoint kind)."""
    return kv_cache_dtype(name, loaded.dtype, getattr(loaded, "checkpoint_format", ""),
                          getattr(loaded, "checkpoint_dtype", None))


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers (K and V) in the cache's storage dtype: what the
    engine divides memory by. [layers, 2, block_size, kv_heads, head_dim] elements: a GQA model
    counts its KV heads (8 x 128 on Llama 3.x 8B), not its query heads."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element_size


class KVCache:
    """Keys and values of every layer in fixed-size blocks, in `dtype` (the model's compute
    dtype, or float16 / bf16 under a float32 model: kv_cache_dtype).

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
