"""The engine's memory bound: weights + KV pool + the activations of the largest step.

Stated at startup (stderr) and checked before the KV pool is allocated: an engine that could
not hold its own pool and one full step fails at once with a clear message, instead of being
killed by the OOM killer under load.

    activations <= T * (6 * hidden + 3 * intermediate + q/k/v width) * 4 bytes   (T = budget)
                 + S * vocab * 4 bytes * 2                                        (logits, sampler)

where T is max_num_batched_tokens and S max_num_seqs. The per-token term counts the residual
stream, norms, attention input/output, the MLP's gate/up/act tensors and the query/key/value
projections, in float32 (the widest dtype a step uses); the logits term is the [S, vocab]
float32 logits plus one same-sized sampler temporary.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

MIB = 2**20


@dataclass(frozen=True)
class MemoryBound:
    weights_bytes: int
    kv_pool_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_pool_bytes + self.activation_bytes

    def describe(self) -> str:
        return (f"weights {self.weights_bytes / MIB:.0f} MiB + KV pool "
                f"{self.kv_pool_bytes / MIB:.0f} MiB + activations <= "
                f"{self.activation_bytes / MIB:.0f} MiB = {self.total_bytes / MIB:.0f} MiB")


def activation_bytes(config: Any, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Upper estimate of one step's activations (see the module docstring)."""
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = (6 * config.hidden_size + 3 * config.intermediate_size + qkv) * 4
    logits = max_num_seqs * config.vocab_size * 4 * 2
    return max_num_batched_tokens * per_token + logits


def model_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers, each storage once: fused projections are
    buffers whose rows the child layers' weights view (LlamaAttention's qkv, the MLP's
    gate/up), and a tied head is the embedding; counted per tensor they were ~240 MiB of the
    SmolLM2's 538 MiB again."""
    storages: dict[tuple[str, int], int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        storage = t.untyped_storage()
        storages[(str(t.device), storage.data_ptr())] = storage.nbytes()
    # GGUF-native matrices (gguf_modules): the file's blocks, each weight once (a tied head
    # is the embedding); they are neither parameters nor buffers.
    gguf_weights = {id(m.gguf_weight): m.gguf_weight.nbytes for m in model.modules()
                    if hasattr(m, "gguf_weight")}
    return sum(storages.values()) + sum(gguf_weights.values())


def available_bytes(device: Any) -> int | None:
    """Memory a new allocation can still get: CUDA's free memory, or MemAvailable on Linux."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def kv_bytes_from_fraction(loaded: Any, fraction: float, max_num_batched_tokens: int,
                           max_num_seqs: int) -> int:
    """KV pool bytes for `kv_cache_memory_fraction` (vLLM's gpu_memory_utilization on a CPU):
    that share of the memory available now (the weights are loaded: MemAvailable, or CUDA's
    free memory), less one step's activations, so the pool and a full step stay within the
    share. ValueError when nothing is left for the pool."""
    available = available_bytes(loaded.device)
    if available is None:
        raise ValueError("kv_cache_memory_fraction needs the free memory, which this system "
                         "does not report: give --kv-cache-memory-bytes instead")
    activations = activation_bytes(loaded.config, max_num_batched_tokens, max_num_seqs)
    pool = int(fraction * available) - activations
    print(f"[cadence engine] KV pool from kv_cache_memory_fraction {fraction:g}: "
          f"{fraction:g} x {available / MIB:.0f} MiB free - {activations / MIB:.0f} MiB "
          f"activations = {max(pool, 0) / MIB:.0f} MiB", file=sys.stderr)
    if pool <= 0:
        raise ValueError(
            f"kv_cache_memory_fraction {fraction:g} of {available / MIB:.0f} MiB free leaves "
            f"nothing for the KV pool after one step's activations "
            f"({activations / MIB:.0f} MiB): raise it, or lower --max-num-batched-tokens / "
            "--max-num-seqs")
    return pool


def check_memory_bound(loaded: Any, kv_pool_bytes: int, max_num_batched_tokens: int,
                       max_num_seqs: int) -> MemoryBound:
    """State the bound on stderr; ValueError when the pool plus one step cannot fit in what is
    available now (the weights are already loaded, so they are not counted again)."""
    bound = MemoryBound(model_bytes(loaded.model), kv_pool_bytes,
                        activation_bytes(loaded.config, max_num_batched_tokens, max_num_seqs))
    print(f"[cadence engine] memory bound: {bound.describe()}", file=sys.stderr)
    available = available_bytes(loaded.device)
    needed = bound.kv_pool_bytes + bound.activation_bytes
    if available is not None and needed > available:
        raise ValueError(
            f"the KV pool ({bound.kv_pool_bytes / MIB:.0f} MiB) and one step's activations "
            f"(<= {bound.activation_bytes / MIB:.0f} MiB) need {needed / MIB:.0f} MiB, but only "
            f"{available / MIB:.0f} MiB are available: lower --kv-cache-memory / "
            "--num-kv-blocks, --max-num-batched-tokens or --max-num-seqs")
    return bound
