"""Load a Llama-family model and its tokenizer from one GGUF file (llama.cpp's format)."""

from __future__ import annotations

import re
from typing import Iterator

import gguf
import numpy as np
import torch

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_fields import GGUFFile, gguf_value
from cadence.model.gguf_tokenizer import tokenizer_from_gguf
from cadence.model.llama import LlamaForCausalLM
from cadence.model.tokenizer import Tokenizer, TokenizerError
from cadence.model.weights import build_model

# llama.cpp tensor names -> Hugging Face parameter names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# GGUF architectures this loader reads (llama.cpp writes Mistral as "llama").
_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a GGUF tensor, or None if it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> HF rotate_half halves).

    The converter reorders each head's rows from [x0..x(d/2-1), y0..y(d/2-1)] to pairs
    [x0, y0, x1, y1, ...]; we reverse it. weight: [num_heads * head_dim, ...] (rows = outputs).
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def dequantize(data: np.ndarray, tensor_type: gguf.GGMLQuantizationType) -> np.ndarray:
    """Float32 values of a GGUF tensor's raw data ([..., row bytes] for quantized types).

    Q4_1 and Q8_0 (the default model's types) are decoded over the whole tensor in a few numpy
    ops, with the same float32 arithmetic as gguf.quants (which works 16 rows at a time and is
    several times slower); every other type goes through gguf.quants.
    """
    if tensor_type == gguf.GGMLQuantizationType.Q4_1:
        # block: f16 scale d, f16 min m, 16 bytes of nibbles (low nibbles = values 0..15).
        blocks = np.ascontiguousarray(data).reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n_blocks, 1]
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        values = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1).astype(np.float32)
        return ((d * values) + m).reshape(*data.shape[:-1], -1)
    if tensor_type == gguf.GGMLQuantizationType.Q8_0:
        # block: f16 scale d, 32 int8 values.
        blocks = np.ascontiguousarray(data).reshape(-1, 34)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        values = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (values * d).reshape(*data.shape[:-1], -1)
    return gguf.quants.dequantize(data, tensor_type)


def config_from_gguf(reader: GGUFFile | gguf.GGUFReader, tensor_names: set[str]) -> ModelConfig:
    arch = gguf_value(reader, "general.architecture", None)
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(_ARCHITECTURES)})"
        )
    scaling = gguf_value(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear") or "rope_freqs.weight" in tensor_names:
        raise ModelLoadError(f"GGUF rope scaling {scaling!r} is not supported")

    def key(name: str, default=None):
        value = gguf_value(reader, f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}")
        return value

    hidden = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    vocab = gguf_value(reader, f"{arch}.vocab_size", None)
    if vocab is None:
        vocab = len(gguf_value(reader, "tokenizer.ggml.tokens", []))
    try:
        return ModelConfig(
            architecture=_ARCHITECTURES[arch],
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(key("attention.head_count_kv", num_heads)),
            head_dim=int(key("attention.key_length", hidden // num_heads)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            max_position_embeddings=int(key("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias=_ARCHITECTURES[arch] == "qwen2",
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id", None),
            eos_token_id=gguf_value(reader, "tokenizer.ggml.eos_token_id", None),
        )
    except ValueError as exc:
        raise ModelLoadError(f"GGUF metadata describes an invalid model: {exc}") from exc


def _tensors(reader: GGUFFile | gguf.GGUFReader, config: ModelConfig, rotary_permuted: bool,
             source: str) -> Iterator[tuple[str, torch.Tensor]]:
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{source}: unexpected GGUF tensor {tensor.name!r}")
        # GGUF lists dims innermost first; torch wants [rows, cols] = reversed.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
            # Copy: float tensors come back as read-only views of the memory-mapped file.
            array = np.array(array, dtype=np.float32, order="C", copy=True).reshape(shape)
        except (ValueError, NotImplementedError) as exc:
            raise ModelLoadError(f"{source}: cannot decode tensor {tensor.name!r}: {exc}") from exc
        weight = torch.from_numpy(array)
        if rotary_permuted and ".attn_q." in tensor.name:
            weight = unpermute_rotary(weight, config.num_heads)
        elif rotary_permuted and ".attn_k." in tensor.name:
            weight = unpermute_rotary(weight, config.num_kv_heads)
        yield name, weight


# GGUF types of the layers' matmul weights that the float32 fast path's integer formats hold
# (fused_decode.WEIGHT_FORMATS): Q4_1 exactly (4 bits, a scale and a minimum per 32, what
# `int4` stores), Q4_0 as a Q4_1 block with minimum -8 scales, Q8_0 in `int8`.
_INTEGER_FORMAT_OF_TYPE = {
    gguf.GGMLQuantizationType.Q4_0: "int4",
    gguf.GGMLQuantizationType.Q4_1: "int4",
    gguf.GGMLQuantizationType.Q8_0: "int8",
}


def gguf_weight_format(path: str) -> str | None:
    """The integer weight format ("int4", "int8") that holds this GGUF file's layer weights as
    stored, when most of them are of one such type; None for float or other quantized files
    (and for anything unreadable: load_gguf reports that)."""
    try:
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError):
        return None
    counts: dict[str, int] = {}
    for t in reader.tensors:
        match = _LAYER_RE.match(t.name)
        if match and match.group(2).endswith(".weight") and "norm" not in match.group(2):
            fmt = _INTEGER_FORMAT_OF_TYPE.get(t.tensor_type, "other")
            counts[fmt] = counts.get(fmt, 0) + 1
    if not counts:
        return None
    best = max(counts, key=counts.get)
    return best if best != "other" and counts[best] * 2 > sum(counts.values()) else None


def load_gguf(path: str, dtype: torch.dtype,
              device: torch.device) -> tuple[LlamaForCausalLM, ModelConfig, Tokenizer]:
    """Model, config and tokenizer from a GGUF file; ModelLoadError on anything unexpected."""
    try:
        # Our one-pass reader: gguf.GGUFReader takes seconds on a large vocabulary's metadata.
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file: {exc}") from exc
    names = {t.name for t in reader.tensors}
    config = config_from_gguf(reader, names)
    # llama.cpp permutes q/k only for the llama family; Qwen2 keeps HF's layout (NeoX rope).
    rotary_permuted = config.architecture in ("llama", "mistral")
    model = build_model(config, _tensors(reader, config, rotary_permuted, path), dtype, device, path)
    try:
        tokenizer = tokenizer_from_gguf(reader)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return model, config, tokenizer
