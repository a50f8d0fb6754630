"""The fused decode stack of a GGUF-native model (`--quantization gguf`): every decoder layer of a
small batch in one C++ call (kernels.DecodeStackGGUF, kernels/gguf/decode_stack_gguf.cpp).

It computes on the GGUFWeights the model's GGUFLinear modules hold (the file's memory-mapped
blocks, the repacked Q4_K / Q5_K / Q6_K octets), referenced, not copied, with the per-op path's GGUF
kernels and activation quantization: stack and per-op path give the same bits for a row, so a
step's route never changes tokens (docs/ARCHITECTURE.md invariant 1). It takes the steps the
float32 stack takes (fused_decode.takes_stack); CADENCE_DECODE_STACK=0 turns it off.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from cadence.model.fused_decode import has_f32_stack, stack_enabled
from cadence.model.gguf_modules import GGUFLinear

if TYPE_CHECKING:
    from cadence.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


def _projections(layer) -> list[GGUFLinear]:
    """A layer's 7 GGUF linears in the stack's order: q, k, v, o, gate, up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def build_gguf_decode_stack(model: "LlamaForCausalLM", kernels: ModuleType):
    """The GGUF stack over the model's GGUF weights, or None where it does not apply: the stack
    switched off, a family other than plain Llama (config.is_plain_llama), a kernel build
    without the float32 stack's tier, a projection that is not a GGUFLinear, or shapes the C++
    side refuses (head_dim other than 64 / 128)."""
    config = model.config
    if not stack_enabled() or not config.is_plain_llama or not has_f32_stack(kernels):
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
            post_norm=[layer.post_attention_layernorm.weight.detach() for layer in layers],
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
    head = model.lm_head
    if isinstance(head, GGUFLinear) and hasattr(stack, "attach_head"):
        # The LM head too (LlamaForCausalLM.forward_logits: a decode step's logits in the stack's call).
        w = head.gguf_weight
        stack.attach_head(blocks=w.kernel_blocks, type=int(w.ggml_type), packed=w.packed, bias=head.bias,
                          N=w.out_features)
    return stack
