"""GGUF tensor names -> cadence's (Hugging Face) parameter names, per GGUF architecture.

llama.cpp's converter (convert_hf_to_gguf.py, through gguf-py's TensorNameMap) renames every
HF tensor; the names below invert that map for the families cadence serves. Two families need
more than a rename:
- the norm called `ffn_norm` is the MLP's pre-norm everywhere, which HF calls
  `post_attention_layernorm` in Llama-style layers but `pre_feedforward_layernorm` in Gemma 2/3
  (whose `post_attention_layernorm` normalizes the attention output: GGUF `post_attention_norm`);
- Phi-3 stores q/k/v as one `attn_qkv` and gate/up as one `ffn_up` (HF's own fused layout):
  `split_fused` cuts them back into the separate projections.
llama.cpp computes rope on interleaved pairs for the llama-style archs, so the converter permutes
q/k rows there (`ROTARY_PERMUTED_ARCHS`); `unpermute_rotary` undoes it.
Mixture-of-experts layers (qwen3moe; Mixtral as llama) store the router as `ffn_gate_inp` and
each projection of all experts as one 3-D tensor (`ffn_gate_exps` [E, I, H] in torch order,
`ffn_up_exps`, `ffn_down_exps` [E, H, I]; gate and up fused as `ffn_gate_up_exps` [E, 2I, H]
by the converter's optional fusion): `expert_projections` names the per-expert projections
that expert e's rows of such a tensor are.
"""

from __future__ import annotations

import re

import torch

# GGUF archs whose q/k rows the converter permutes (LlamaModel.permute; LLAMA_ROPE_TYPE_NORM).
ROTARY_PERMUTED_ARCHS = frozenset({"llama", "smollm3"})

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors the converter adds that are not parameters: rope factors, read into the config.
ROPE_FACTOR_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight",
                                 "rope_factors_short.weight"})

_COMMON_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_down.bias": "mlp.down_proj.bias",
}
_LLAMA_STYLE_NORMS = {"ffn_norm.weight": "post_attention_layernorm.weight"}
_MOE_ROUTER = {"ffn_gate_inp.weight": "mlp.gate.weight"}
# 3-D expert tensors -> the HF projections each expert's rows hold, in row order.
EXPERT_TENSORS = {"ffn_gate_exps.weight": ("gate_proj",), "ffn_up_exps.weight": ("up_proj",),
                  "ffn_down_exps.weight": ("down_proj",), "ffn_gate_up_exps.weight": ("gate_proj", "up_proj")}
_GEMMA_NORMS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# Phi-3's fused tensors, split by split_fused into the names after the arrow.
PHI3_FUSED = {"attn_qkv.weight": ("q_proj", "k_proj", "v_proj"), "ffn_up.weight": ("gate_proj", "up_proj")}

_LAYER_NAMES_BY_ARCH = {
    "llama": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS, **_MOE_ROUTER},  # Mixtral's router too
    "qwen2": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS},
    "qwen3": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS},
    "qwen3moe": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS, **_MOE_ROUTER},
    "smollm3": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS},
    "phi3": {**_COMMON_LAYER_NAMES, **_LLAMA_STYLE_NORMS},
    "gemma2": {**_COMMON_LAYER_NAMES, **_GEMMA_NORMS},
    "gemma3": {**_COMMON_LAYER_NAMES, **_GEMMA_NORMS},
}
LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The HF parameter name of a GGUF tensor of `arch`, or None if it has no counterpart
    (fused Phi-3 tensors have several: see split_fused)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = LAYER_RE.match(gguf_name)
    if match is None:
        return None
    layer, rest = match.groups()
    if arch == "phi3" and rest in PHI3_FUSED:
        return None
    name = _LAYER_NAMES_BY_ARCH[arch].get(rest)
    return None if name is None else f"model.layers.{layer}.{name}"


def expert_projections(gguf_name: str) -> tuple[str, tuple[str, ...]] | None:
    """(HF prefix of the layer's experts, e.g. "model.layers.3.mlp.experts", the projections
    each expert's rows hold in order) for a 3-D expert tensor, or None for any other name.
    Expert e's projection p is then f"{prefix}.{e}.{p}.weight"."""
    match = LAYER_RE.match(gguf_name)
    if match is None or match.group(2) not in EXPERT_TENSORS:
        return None
    layer, rest = match.groups()
    return f"model.layers.{layer}.mlp.experts", EXPERT_TENSORS[rest]


def split_fused(gguf_name: str, weight: torch.Tensor, q_size: int,
                kv_size: int) -> list[tuple[str, torch.Tensor]] | None:
    """Phi-3's fused tensor as its HF projections, or None when the name is not a fused one.

    attn_qkv: [q_size + 2 * kv_size, hidden] = q rows, k rows, v rows.
    ffn_up: [2 * intermediate, hidden] = gate rows, then up rows (HF Phi3MLP chunks it so).
    """
    match = LAYER_RE.match(gguf_name)
    if match is None or match.group(2) not in PHI3_FUSED:
        return None
    layer, rest = match.groups()
    if rest == "attn_qkv.weight":
        if weight.shape[0] != q_size + 2 * kv_size:
            return None
        parts = weight.split([q_size, kv_size, kv_size])
        prefix = f"model.layers.{layer}.self_attn"
    else:
        if weight.shape[0] % 2:
            return None
        parts = weight.chunk(2)
        prefix = f"model.layers.{layer}.mlp"
    return [(f"{prefix}.{proj}.weight", part) for proj, part in zip(PHI3_FUSED[rest], parts)]


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> HF rotate_half halves).

    The converter reorders each head's rows from [x0..x(d/2-1), y0..y(d/2-1)] to pairs
    [x0, y0, x1, y1, ...]; we reverse it. weight: [num_heads * head_dim, ...] (rows = outputs;
    a bias is [num_heads * head_dim]).
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
