"""One startup line that says how this machine will run the model, and a warning when a slow
path is in use: CPU features, kernel tier, compute dtype, weight storage, threads, mixture of
experts (which never takes the fused decode stack), KV pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cadence.model.loader import LoadedModel


def describe_fast_path(loaded: "LoadedModel", kv_tokens: int | None = None) -> tuple[str, str | None]:
    """(the line, a warning or None)."""
    parts = []
    warning = None
    dtype = str(loaded.dtype).removeprefix("torch.")
    if loaded.device.type == "cpu":
        from cadence.model.fused_decode import stack_enabled
        from cadence.model.kernels.cpu_ops import kernels_enabled, load_cpu_kernels
        from cadence.model.kernels.isa import describe, native_bf16

        kernels = load_cpu_kernels() if kernels_enabled() else None
        parts.append(describe())
        parts.append(f"kernels {kernels.kernel_tier() if kernels is not None else 'off (pure torch)'}")
        weights = loaded.model.decode_weight_format if loaded.dtype == torch.float32 else dtype
        parts.append(f"compute {dtype}, weights {weights}")
        parts.append(f"threads {torch.get_num_threads()}")
        if loaded.dtype == torch.bfloat16 and not native_bf16():
            warning = ("bf16 compute on a CPU without native bf16: torch's bf16 matmul is a slow "
                       "fallback here (dozens of times slower); use --dtype auto or float32")
        elif kernels is None:
            warning = "compiled CPU kernels off: the pure-torch path is several times slower"
        elif not stack_enabled():
            warning = "fused decode stack off (CADENCE_DECODE_STACK=0): decode steps run op by op"
    else:
        parts.append(f"device {loaded.device}, compute {dtype}")
    config = loaded.config
    if config.num_experts:
        # The fused decode stacks are dense-only (ModelConfig.stack_computes): every step of a
        # mixture-of-experts model runs layer by layer, each chosen expert once over its rows.
        parts.append(f"mixture of experts ({config.num_experts} experts, top {config.num_experts_per_tok}): "
                     "per-op path, no fused decode stack")
    if kv_tokens is not None:
        parts.append(f"KV pool {kv_tokens} tokens")
    return "; ".join(parts), warning
