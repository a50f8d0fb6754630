"""The fused CPU decode path: every decoder layer of a small batch in one C++ call.

Two stacks, by compute dtype:
- bf16 (`kernels.DecodeStack`, decode_stack.cpp): weights packed for the AVX512-BF16 GEMM; only
  in the avx512bf16 kernel tier.
- float32 (`kernels.DecodeStackF32`, avx2/decode_stack_f32.cpp): float32 compute on weights stored
  compressed (float32, bf16 or int8 with per-group scales) and widened in registers; every tier
  with AVX2 + FMA. Which storage: the model's `decode_weight_format` (`--quantization`).
Both run the whole decoder inside one OpenMP parallel region: no Python per layer, no thread
wake-up per op, every GEMM split over all threads. Steps they take: CPU, at most STACK_MAX_ROWS
new tokens, no prefill chunk longer than STACK_MAX_CHUNK (attention there runs one query row at a
time over its context; long chunks go to the prefill path). Everything else takes the per-op
path. CADENCE_DECODE_STACK=0 turns them off (A/B runs, debugging).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from cadence.core.step_cost import FUSED_STEP_MAX_CHUNK, FUSED_STEP_MAX_ROWS
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.moe import layer_mlps

if TYPE_CHECKING:
    from cadence.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# Rows (new tokens) per step the stack takes: decode batches up to this size. Above it the
# per-op path's torch GEMMs catch up with the packed kernel. Longest prefill chunk the stack
# takes (same bound as the paged kernel's chunk path). Both defined in core, whose step-cost
# model prices the per-op path's fixed cost by them.
STACK_MAX_ROWS = FUSED_STEP_MAX_ROWS
STACK_MAX_CHUNK = FUSED_STEP_MAX_CHUNK
ENV_SWITCH = "CADENCE_DECODE_STACK"


def stack_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


# Packed weight formats of the float32 stack and LM head (avx2/packed_gemm_f32.h).
WEIGHT_FORMATS = {"float32": 0, "bf16": 1, "int8": 2, "int4": 3}
# The integer formats: activations quantized per group of 32 (quantize_activations_q8).
INTEGER_FORMATS = ("int8", "int4")


def step_fits_stack(num_rows: int, meta: AttentionMetadata) -> bool:
    """Whether a step of `num_rows` rows is small enough for the fused stack (its shape alone:
    checkable before the embeddings exist)."""
    return num_rows <= STACK_MAX_ROWS and meta.max_new_tokens <= STACK_MAX_CHUNK


def takes_stack(x: torch.Tensor, meta: AttentionMetadata) -> bool:
    """Whether this step's rows (x: [T, H] embeddings) go through the fused stack."""
    return (x.dtype in (torch.bfloat16, torch.float32) and x.device.type == "cpu"
            and step_fits_stack(x.shape[0], meta))


def has_f32_stack(kernels: ModuleType) -> bool:
    """Whether this kernel build has the float32 stack (any tier with AVX2 + FMA)."""
    return hasattr(kernels, "DecodeStackF32") and kernels.kernel_tier() in ("avx2", "avx512", "avx512bf16")


def resolve_weight_format(model: "LlamaForCausalLM") -> str:
    """The storage format of the float32 fast path's packed weights: the model's
    `decode_weight_format` (set by the loader from `--quantization` and `--dtype`), with int8
    falling back to bf16 where a GEMM's K does not split into int8's groups of 32."""
    fmt = getattr(model, "decode_weight_format", "float32")
    cfg = model.config
    ks = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size, cfg.expert_intermediate_size)
    if fmt in INTEGER_FORMATS and any(k % 32 for k in ks):
        return "bf16"
    return fmt


def lm_head_format(fmt: str) -> str:
    """The LM head's storage for layers stored as `fmt`: int8 under int4 layers. The head (tied to
    the embeddings in small models) is where 4 bits cost the most quality, and GGUF files keep it
    at 8 bits or more (SmolLM2's Q4_1 file: Q4_1 layers, a Q8_0 token_embd), so int4 layers and
    an int8 head reproduce such a file's weights."""
    return "int8" if fmt == "int4" else fmt


def stored_values(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 values a packed copy of `weight` [N, K] in `fmt` computes with: bf16-rounded,
    int8 with a scale per row and group of 32 along K, or int4 with a float16 scale and minimum
    per row and group (the same float32 operations as pack_weight_f32, so the values match the
    kernel's exactly)."""
    w = weight.detach().float()
    if fmt == "bf16":
        return w.bfloat16().float()
    if fmt == "int8":
        groups = w.reshape(w.shape[0], -1, 32)  # [N, K/32, 32]
        scale = groups.abs().amax(-1, keepdim=True) / 127.0
        q = torch.where(scale == 0, torch.zeros_like(groups), torch.round(groups / scale)).clamp_(-127, 127)
        return (q * scale).reshape(w.shape)
    if fmt == "int4":
        # w = d * q + m per row and group of 32 along K, d = range / 15 and m = min rounded to
        # float16, q in [0, 15] (avx2/q4_gemm.h).
        groups = w.reshape(w.shape[0], -1, 32)  # [N, K/32, 32]
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        d = ((hi - lo) / 15.0).half().float()
        m = lo.half().float()
        q = torch.where(d == 0, torch.zeros_like(groups), torch.round((groups - m) / d)).clamp_(0, 15)
        return (q * d + m).reshape(w.shape)
    return w


def round_weights_to_format(model: "LlamaForCausalLM", fmt: str) -> None:
    """Replace the float32 model's GEMM weights (and the tied or untied LM head) in place by the
    values their compressed packed copies hold, so every path (the fused stack, the per-op and
    prefill GEMMs of torch) computes with the same weights: scheduling then never changes
    results (DESIGN.md invariant 1), only summation order differs as between any two kernels."""
    if fmt == "float32":
        return
    with torch.no_grad():
        for layer in model.model.layers:
            mlps = layer_mlps(layer)  # the dense MLP, or an MoE layer's experts (routers stay float)
            for w in (layer.self_attn.fused_weight, layer.self_attn.o_proj.weight,
                      *(m.fused_weight for m in mlps), *(m.down_proj.weight for m in mlps)):
                w.copy_(stored_values(w, fmt))
        model.lm_head.weight.copy_(stored_values(model.lm_head.weight, lm_head_format(fmt)))


def build_decode_stack(model: "LlamaForCausalLM", kernels: ModuleType):
    """The fused stack for the model's dtype over its current weights, or None when the model's
    shapes (head_dim, sizes) or the kernel build do not allow it, or when its layers are not a
    shape the C++ stacks compute (config.stack_computes: plain Llama, plus Qwen3's q/k norms;
    other families run the per-op path, whose pieces read every family field)."""
    config = model.config
    if not stack_enabled():
        return None
    dtype = model.lm_head.weight.dtype
    if not config.stack_computes():
        return None
    if dtype == torch.bfloat16 and kernels.has_avx512bf16():
        stack = _build(model, kernels.DecodeStack, {})
    elif dtype == torch.float32 and has_f32_stack(kernels):
        stack = _build(model, kernels.DecodeStackF32, {"format": WEIGHT_FORMATS[resolve_weight_format(model)]})
    else:
        return None
    if stack is not None and config.qk_norm:
        attach_qk_norms(stack, model.model.layers)
    return stack


def attach_qk_norms(stack, layers) -> None:
    """Give a stack the layers' per-head q/k norm weights (Qwen3: [head_dim] each), applied before
    rope as the per-op path's rope_write_kv applies them (passed as float32: the bf16 stack holds
    them as bf16 again, which a bf16 model's weights round-trip exactly)."""
    stack.attach_qk_norms(q_norm=[layer.self_attn.q_norm.weight.detach().float() for layer in layers],
                          k_norm=[layer.self_attn.k_norm.weight.detach().float() for layer in layers])


def _build(model: "LlamaForCausalLM", stack_class, extra: dict):
    layers = model.model.layers
    attn = [layer.self_attn for layer in layers]
    mlp = [layer.mlp for layer in layers]
    try:
        return stack_class(
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
            **extra,
        )
    except RuntimeError as exc:
        logger.info("fused decode stack not used for this model: %s", exc)
        return None
