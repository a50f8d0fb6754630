"""The fused decode stack of a GGUF-native model (`--quantization gguf`): every decoder layer of a
small batch in one C++ call (kernels.DecodeStackGGUF, kernels/gguf/decode_stack_gguf.cpp).

It computes on the GGUFWeights the model's GGUFLinear modules hold (the file's memory-mapped
blocks, the repacked K-quant octets), referenced, not copied, with the per-op path's GGUF
kernels and activation quantization: stack and per-op path give the same bits for a row, so a
step's route never changes tokens (docs/ARCHITECTURE.md invariant 1). It takes the steps the
float32 stack takes (fused_decode.takes_stack); CADENCE_DECODE_STACK=0 turns it off.

Beyond plain Llama layers it computes Qwen3's and Gemma 2/3's (gguf_stack_computes): per-head q/k
RMS norms before rope (rows.h qk_norm_row, which the per-op path's rope_write_kv runs too),
sandwich norms, GeGLU, the query_pre_attn_scalar scale, sliding-window layers (the paged kernel's
windowed span plan, which the per-op path runs too) on their own rope base; the embedding
multiplier applies before the stack (LlamaForCausalLM._embed), and forward_logits leaves final
soft-capping out.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from cadence.model.config import ModelConfig
from cadence.model.fused_decode import attach_qk_norms, has_f32_stack, stack_enabled
from cadence.model.gguf_modules import GGUFLinear

if TYPE_CHECKING:
    from cadence.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


def _projections(layer) -> list[GGUFLinear]:
    """A layer's 7 GGUF linears in the stack's order: q, k, v, o, gate, up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def gguf_stack_computes(config: ModelConfig) -> bool:
    """Whether the GGUF stack computes every layer of `config` as the per-op path does: dense
    SwiGLU or GeGLU layers with pre-norms (and Gemma's sandwich norms), per-head q/k norms
    (Qwen3, Gemma 3), any attention scale, full layers and sliding-window ones, rope over whole
    heads on every layer (a global and a local base). Not: attention soft-capping (Gemma 2),
    partial or per-layer rope, MLP biases, mixture-of-experts layers."""
    return (config.attn_logit_softcapping is None and config.rope_layers is None
            and config.partial_rotary_factor == 1.0 and not config.mlp_bias and config.num_experts == 0)


def build_gguf_decode_stack(model: "LlamaForCausalLM", kernels: ModuleType):
    """The GGUF stack over the model's GGUF weights, or None where it does not apply: the stack
    switched off, layers it does not compute (gguf_stack_computes), a kernel build without the
    float32 stack's tier, a projection that is not a GGUFLinear, or shapes the C++ side refuses
    (head_dim other than 64 / 128 / 256)."""
    config = model.config
    if not stack_enabled() or not gguf_stack_computes(config) or not has_f32_stack(kernels):
        return None
    if not hasattr(kernels, "DecodeStackGGUF"):
        return None
    layers = model.model.layers
    linears = [lin for layer in layers for lin in _projections(layer)]
    if not layers or not all(isinstance(lin, GGUFLinear) for lin in linears):
        return None
    weights = [lin.gguf_weight for lin in linears]
    try:
        stack = kernels.DecodeStackGGUF(
            blocks=[w.kernel_blocks for w in weights],
            types=[int(w.ggml_type) for w in weights],
            packed=[w.packed for w in weights],
            biases=[lin.bias for lin in linears],
            input_norm=[layer.input_layernorm.weight.detach() for layer in layers],
            # The MLP's pre-norm: Gemma's pre_feedforward_layernorm, else post_attention_layernorm.
            post_norm=[_mlp_norm(layer).weight.detach() for layer in layers],
            final_norm=model.model.norm.weight.detach(),
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            intermediate=config.intermediate_size,
            eps=config.rms_norm_eps,
        )
    except RuntimeError as exc:
        logger.info("GGUF decode stack not used for this model: %s", exc)
        return None
    _set_family_pieces(stack, model)
    head = model.lm_head
    if isinstance(head, GGUFLinear) and hasattr(stack, "attach_head"):
        # The LM head too (LlamaForCausalLM.forward_logits: a decode step's logits in the stack's call).
        w = head.gguf_weight
        stack.attach_head(blocks=w.kernel_blocks, type=int(w.ggml_type), packed=w.packed, bias=head.bias,
                          N=w.out_features)
    return stack


def _mlp_norm(layer):
    return layer.pre_feedforward_layernorm if layer.sandwich else layer.post_attention_layernorm


def _set_family_pieces(stack, model: "LlamaForCausalLM") -> None:
    """Qwen3's and Gemma's pieces on the stack: q/k norms, sandwich norms, GeGLU, windows and the
    local rope."""
    from cadence.model.llama import LOCAL_ROPE  # llama imports this module

    config, layers = model.config, model.model.layers
    if config.qk_norm:
        attach_qk_norms(stack, layers)
    if config.sandwich_norms:
        stack.attach_sandwich_norms(attn_out=[layer.post_attention_layernorm.weight.detach() for layer in layers],
                                    mlp_out=[layer.post_feedforward_layernorm.weight.detach() for layer in layers])
    if config.hidden_act == "gelu_pytorch_tanh":
        stack.use_gelu_tanh()
    if config.layer_types is not None:
        stack.set_layer_attention(windows=[config.layer_window(i) or 0 for i in range(config.num_layers)],
                                  local_rope=[layer.rope_key == LOCAL_ROPE for layer in layers])
