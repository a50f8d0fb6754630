"""The fused CPU decode path: every decoder layer of a small bf16 batch in one C++ call.

`kernels.DecodeStack` (src/cadence/model/kernels/decode_stack.cpp) holds the layers' weights
packed for the AVX512-BF16 GEMM and runs the whole decoder inside one OpenMP parallel region:
no Python per layer, no thread wake-up per op, and every GEMM (even the 0.7 MB ones) split over
all threads. Steps it takes: bf16 on CPU, at most STACK_MAX_ROWS new tokens, no prefill chunk
longer than STACK_MAX_CHUNK (attention there runs one query row at a time over its context;
long chunks go to the flash/SDPA prefill path). Everything else takes the per-op path.
CADENCE_DECODE_STACK=0 turns it off (A/B runs, debugging).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from cadence.model.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from cadence.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# Rows (new tokens) per step the stack takes: decode batches up to this size. Above it the
# per-op path's torch GEMMs catch up with the packed kernel.
STACK_MAX_ROWS = 64
# Longest prefill chunk the stack takes (same bound as the paged kernel's chunk path).
STACK_MAX_CHUNK = 32
ENV_SWITCH = "CADENCE_DECODE_STACK"


def stack_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def takes_stack(x: torch.Tensor, meta: AttentionMetadata) -> bool:
    """Whether this step's rows (x: [T, H] embeddings) go through the fused stack."""
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.shape[0] <= STACK_MAX_ROWS
            and meta.max_new_tokens <= STACK_MAX_CHUNK)


def build_decode_stack(model: "LlamaForCausalLM", kernels: ModuleType):
    """A kernels.DecodeStack over the model's current weights, or None when the model's shapes
    (head_dim, sizes) or the build (no AVX512-BF16) do not allow it."""
    if not stack_enabled() or not kernels.has_avx512bf16():
        return None
    layers = model.model.layers
    attn = [layer.self_attn for layer in layers]
    mlp = [layer.mlp for layer in layers]
    try:
        return kernels.DecodeStack(
            qkv=[a.fused_weight for a in attn],
            qkv_bias=[a.fused_bias for a in attn] if attn[0].fused_bias is not None else [],
            o=[a.o_proj.weight.detach() for a in attn],
            gate_up=[m.fused_weight for m in mlp],
            down=[m.down_proj.weight.detach() for m in mlp],
            input_norm=[layer.input_layernorm.weight.detach() for layer in layers],
            post_norm=[layer.post_attention_layernorm.weight.detach() for layer in layers],
            final_norm=model.model.norm.weight.detach(),
            num_heads=model.config.num_heads,
            num_kv_heads=model.config.num_kv_heads,
            eps=model.config.rms_norm_eps,
        )
    except RuntimeError as exc:
        logger.info("fused decode stack not used for this model: %s", exc)
        return None
