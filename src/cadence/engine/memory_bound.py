"""The engine's memory bound: weights + KV pool + the activations of the largest step.

Stated at startup (stderr) and checked before the KV pool is allocated: an engine that could
not hold its own pool and one full step fails at once with a clear message, instead of being
killed by the OOM killer under load.

    activations <= T * (6 * hidden + 3 * intermediate + q/k/v width + experts) * 4 bytes (T = budget)
                 + S * vocab * 4 bytes * 2                                        (logits, sampler)

where T is max_num_batched_tokens and S max_num_seqs. The per-token term counts the residual
stream, norms, attention input/output, the MLP's gate/up/act tensors and the query/key/value
projections, in float32 (the widest dtype a step uses; on a mixture-of-experts model the
intermediate width is that of a token's top-k experts together, where wider than a dense
layer's, plus its router logits); the logits term is the [S, vocab]
float32 logits plus one same-sized sampler temporary.

On CPU the bound starts from what the process holds once the model is loaded (its resident
set: the weights as they are really held plus the Python/torch runtime, the tokenizer and the
kernels), not from the weights' own byte count: for the 8B-shape Q4_K_M file the weights
counted 4.78 GiB while the process held ~1.3 GiB more (the runtime, and q/k rows that the
loader copies to undo llama.cpp's row permutation, kept next to their repacked copy), so the
served process outgrew the bound it printed. The KV pool and the activations come on top
(the pool's zeroed pages are resident only once written, so the bound errs high).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from cadence.model.host_memory import host_available_bytes

MIB = 2**20
# What the engine builds after the check on top of the loaded model, beyond the activations:
# the kernel library and its thread team, the executor's index buffers, telemetry rings,
# allocator arenas the startup profile leaves behind (the tiny test model's process grew by
# 12 MiB over its weights, pool and activations; see docs/performance.md for the 8B shape).
ENGINE_OVERHEAD_BYTES = 128 * MIB


@dataclass(frozen=True)
class MemoryBound:
    weights_bytes: int
    kv_pool_bytes: int
    activation_bytes: int
    # What the process holds beyond the weights' own bytes once the model is loaded (CPU: its
    # resident set less weights_bytes, plus ENGINE_OVERHEAD_BYTES; 0 where unknown or on an
    # accelerator).
    runtime_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.runtime_bytes + self.kv_pool_bytes + self.activation_bytes

    def describe(self) -> str:
        runtime = (f" + runtime and loader copies {self.runtime_bytes / MIB:.0f} MiB"
                   if self.runtime_bytes else "")
        return (f"weights {self.weights_bytes / MIB:.0f} MiB{runtime} + KV pool "
                f"{self.kv_pool_bytes / MIB:.0f} MiB + activations <= "
                f"{self.activation_bytes / MIB:.0f} MiB = {self.total_bytes / MIB:.0f} MiB")


def activation_bytes(config: Any, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Upper estimate of one step's activations (see the module docstring)."""
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    # MoE: the routed experts' gate/up/act rows of a token, and its router logits.
    per_token = (6 * config.hidden_size + 3 * config.mlp_width_per_token + qkv + config.num_experts) * 4
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


def resident_bytes() -> int | None:
    """This process's resident set (VmRSS), or None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes(device: Any) -> int | None:
    """Memory a new allocation can still get: CUDA's free memory, or MemAvailable on Linux."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return host_available_bytes()


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
    weights = model_bytes(loaded.model)
    runtime = 0
    if getattr(loaded.device, "type", "cpu") == "cpu":
        held = resident_bytes()
        runtime = max(0, held - weights) + ENGINE_OVERHEAD_BYTES if held is not None else 0
    bound = MemoryBound(weights, kv_pool_bytes,
                        activation_bytes(loaded.config, max_num_batched_tokens, max_num_seqs),
                        runtime)
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
