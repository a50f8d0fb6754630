"""ModelConfig from a GGUF file's metadata: one mapping per GGUF architecture.

The reference is what llama.cpp's converter writes (convert_hf_to_gguf.py and its conversion/
package) and what llama.cpp then derives when it loads the file (src/models/<arch>.cpp), since
several HF settings are not stored at all:
- Gemma 2/3: which layers slide (llama.cpp: every 2nd / every 6th layer is global unless
  `attention.sliding_window_pattern` says otherwise), the local rope base (Gemma 3: 10000 unless
  `rope.freq_base_swa`), the attention scale (head_dim, or hidden / heads on the 27B models);
- SmolLM3: every 4th layer has no rope (llama.cpp's n_no_rope_layer_step);
- Llama 3 rope scaling: only its per-frequency factors (`rope_freqs.weight`), from which
  `llama3_rope_scaling` recovers the HF parameters;
- Phi-3 longrope: the factors as tensors (`rope_factors_long/short.weight`) plus the original
  context length and attention factor keys;
- mixture of experts (qwen3moe; Mixtral, written as llama with `expert_count`): llama.cpp
  renormalises the top-k routing weights (build_moe_ffn's norm_w, on for both archs whatever
  HF's norm_topk_prob was; `expert_weights_norm` where a file has it), and a layer is MoE where
  it has a router (`ffn_gate_inp`).
Floats are stored as float32; `_f32` gives back the short decimal they were written from
(1e-06, not 9.99999997e-07), so a config equals the one read from the HF folder.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import gguf
import numpy as np

from cadence.model.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig, RopeScaling
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_fields import GGUFFile, gguf_value

# GGUF general.architecture -> ModelConfig.architecture (llama.cpp writes Mistral as "llama").
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3": "gemma3", "phi3": "phi3", "smollm3": "smollm3", "qwen3moe": "qwen3_moe"}
# A llama file with experts is Mixtral's (llama.cpp has no mixtral architecture).
_LLAMA_WITH_EXPERTS = "mixtral"
# GGUF rope.scaling.type values read here (llama3 and longrope come as factor tensors).
ROPE_SCALING_TYPES = ("none", "linear", "yarn")

# llama.cpp's defaults for what the converter does not store.
_GEMMA_GLOBAL_EVERY = {"gemma2": 2, "gemma3": 6}
_GEMMA_DEFAULT_WINDOW = {"gemma2": 4096}
_GEMMA3_LOCAL_ROPE_BASE = 10000.0
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_SMOLLM3_NO_ROPE_EVERY = 4
# Archs whose attention.sliding_window key means a window (Gemma's every-few-layers ones, and
# one window on every layer for Mistral (as "llama") and Phi-3).
_WINDOWED_ARCHS = ("gemma2", "gemma3", "llama", "phi3")
# Llama 3.x's llama3 rope parameters (all published checkpoints): tried first when recovering
# them from the factors.
_LLAMA3_ORIGINAL_CONTEXT = 8192
_LLAMA3_FREQ_FACTORS = (1.0, 4.0)


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it."""
    return float(str(np.float32(value)))


def _tensor_values(reader: GGUFFile | gguf.GGUFReader, name: str) -> list[float] | None:
    for tensor in reader.tensors:
        if tensor.name == name:
            values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
            return [float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]
    return None


def _embedding_rows(reader: GGUFFile | gguf.GGUFReader) -> int | None:
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # GGUF dims innermost first: [hidden, vocab]
    return None


def llama3_factors(base: float, dim: int, factor: float, low: float, high: float,
                   original: int) -> list[float]:
    """The per-frequency divisors the converter writes as rope_freqs (LlamaModel's
    generate_extra_tensors): 1 for short wavelengths, `factor` for long ones, smooth between."""
    import torch

    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return [float(np.float32(v)) for v in out]


def llama3_rope_scaling(factors: Sequence[float], base: float, dim: int) -> RopeScaling:
    """HF llama3 rope parameters that reproduce `factors` (rope_freqs.weight).

    The factors fix `factor` (their maximum) and, through the smoothed middle entries, two
    ratios of (original context, low, high); Llama 3.x's own values are tried first, then the
    original context that the middle entries give with low=1, high=4. ModelLoadError when no
    candidate reproduces every factor.
    """
    factor = _f32(max(factors))
    stored = np.asarray(factors, dtype=np.float32)
    low, high = _LLAMA3_FREQ_FACTORS
    candidates = [_LLAMA3_ORIGINAL_CONTEXT]
    if factor > 1:
        for i, f in enumerate(factors):
            if 1 < f < factor:
                smooth = (1 / f - 1 / factor) / (1 - 1 / factor)
                wavelen = 2 * math.pi * base ** (2 * i / dim)
                candidates.append(round(wavelen * (smooth * (high - low) + low)))
    for original in candidates:
        if original <= 0:
            continue
        expected = np.asarray(llama3_factors(base, dim, factor, low, high, original), dtype=np.float32)
        if expected.shape == stored.shape and np.allclose(expected, stored, rtol=1e-5, atol=0):
            return RopeScaling(rope_type="llama3", factor=factor, low_freq_factor=low,
                               high_freq_factor=high, original_max_position_embeddings=original)
    raise ModelLoadError("GGUF rope_freqs.weight holds rope factors that no llama3 scaling "
                         f"(low_freq_factor {low}, high_freq_factor {high}) reproduces")


def _longrope_scaling(reader, key, long_factor: list[float], short_factor: list[float] | None,
                      context: int) -> RopeScaling:
    original = key("rope.scaling.original_context_length", None)
    if original is None or short_factor is None:
        raise ModelLoadError("GGUF longrope factors need rope_factors_short.weight and "
                             "rope.scaling.original_context_length")
    original = int(original)
    factor = context / original
    attention = key("rope.scaling.attn_factor", None)
    # HF derives the attention factor from `factor` when the config has none; the converter
    # writes that derived value, so only a different one is kept.
    derived = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    if attention is not None and abs(float(attention) - derived) < 1e-6:
        attention = None
    return RopeScaling(
        rope_type="longrope", factor=factor, original_max_position_embeddings=original,
        long_factor=tuple(_f32(v) for v in long_factor),
        short_factor=tuple(_f32(v) for v in short_factor),
        attention_factor=None if attention is None else _f32(attention))


def _rope_scaling(reader, key, tensor_names: set[str], base: float, rotary_dim: int,
                  context: int) -> RopeScaling | None:
    if "rope_freqs.weight" in tensor_names:
        factors = _tensor_values(reader, "rope_freqs.weight")
        if all(f == 1.0 for f in factors):
            return None
        return llama3_rope_scaling(factors, base, rotary_dim)
    if "rope_factors_long.weight" in tensor_names:
        return _longrope_scaling(reader, key, _tensor_values(reader, "rope_factors_long.weight"),
                                 _tensor_values(reader, "rope_factors_short.weight"), context)
    scaling = key("rope.scaling.type", "none")
    if scaling not in ROPE_SCALING_TYPES:
        raise ModelLoadError(
            f"GGUF rope scaling {scaling!r} is not supported (supported: {list(ROPE_SCALING_TYPES)}, "
            "llama3 as rope_freqs.weight, longrope as rope_factors_long/short.weight)")
    # Older files spell a linear factor rope.scale_linear (with no scaling type).
    factor = key("rope.scaling.factor", key("rope.scale_linear", None))
    if scaling == "none" and key("rope.scale_linear", None) is not None:
        scaling = "linear"
    if scaling == "none" or factor is None or float(factor) == 1.0:
        return None
    if scaling == "linear":
        return RopeScaling(rope_type="linear", factor=_f32(factor))
    # HF's default original context of yarn is the model's own.
    original = key("rope.scaling.original_context_length", context)
    fields: dict[str, Any] = {}
    for gguf_key, field in (("rope.scaling.yarn_beta_fast", "beta_fast"),
                            ("rope.scaling.yarn_beta_slow", "beta_slow"),
                            ("rope.scaling.yarn_attn_factor", "attention_factor")):
        value = key(gguf_key, None)
        if value is not None:
            fields[field] = _f32(value)
    return RopeScaling(rope_type="yarn", factor=_f32(factor),
                       original_max_position_embeddings=int(original), **fields)


def _layer_types(arch: str, key, num_layers: int,
                 context: int) -> tuple[int | None, tuple[str, ...] | None]:
    """(sliding_window, layer_types) as HF spells them, from llama.cpp's rules per arch."""
    window = key("attention.sliding_window", _GEMMA_DEFAULT_WINDOW.get(arch))
    if not window or arch not in _WINDOWED_ARCHS:
        # Qwen2/3 and SmolLM3 configs carry a window they do not use (use_sliding_window
        # false); llama.cpp reads none for them either.
        return None, None
    window = int(window)
    if arch not in _GEMMA_GLOBAL_EVERY:
        # Mistral v0.1, Phi-3: one window on every layer (HF semantics; llama.cpp runs Phi-3
        # with full attention and its converter does not write Mistral's window). A window
        # no shorter than the context never excludes a key (Phi-4-mini's 262144): none.
        if window >= context:
            return None, None
        return window, (SLIDING_ATTENTION,) * num_layers
    pattern = key("attention.sliding_window_pattern", _GEMMA_GLOBAL_EVERY[arch])
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ModelLoadError(f"GGUF sliding_window_pattern has {len(pattern)} entries for "
                                 f"{num_layers} layers")
        sliding = [bool(p) for p in pattern]
    else:
        # llama.cpp's set_swa_pattern: layer il slides unless it is the last of each group.
        every = int(pattern)
        sliding = [every == 0 or il % every < every - 1 for il in range(num_layers)]
    if not any(sliding):
        return None, None
    return window, tuple(SLIDING_ATTENTION if s else FULL_ATTENTION for s in sliding)


def _moe_fields(arch: str, key, tensor_names: set[str], num_layers: int) -> dict[str, Any]:
    """The ModelConfig MoE fields (empty for a dense file): expert counts, the expert width
    (qwen3moe's expert_feed_forward_length; Mixtral's experts are feed_forward_length wide),
    llama.cpp's top-k renormalisation and the layers with a router."""
    experts = int(key("expert_count", 0) or 0)
    if not experts:
        return {}
    moe = tuple(f"blk.{i}.ffn_gate_inp.weight" in tensor_names for i in range(num_layers))
    fields: dict[str, Any] = {
        "num_experts": experts,
        "num_experts_per_tok": int(key("expert_used_count")),
        "norm_topk_prob": bool(key("expert_weights_norm", True)),
        "moe_layers": None if all(moe) else moe,
    }
    if arch == "qwen3moe":
        fields.update(moe_intermediate_size=int(_one_value("expert_feed_forward_length",
                                                           key("expert_feed_forward_length"))),
                      moe_round_routing_weights=True)
    return fields


def _one_value(name: str, value: Any) -> Any:
    # Some archs store per-layer arrays (head counts, FFN widths); cadence's layers are uniform.
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise ModelLoadError(f"GGUF {name} varies per layer ({value[:8]}...), which is not supported")
        return value[0]
    return value


def config_from_gguf(reader: GGUFFile | gguf.GGUFReader, tensor_names: set[str] | None = None) -> ModelConfig:
    """The ModelConfig a GGUF file describes; ModelLoadError for an architecture, rope scaling
    or shape cadence does not serve."""
    if tensor_names is None:
        tensor_names = {t.name for t in reader.tensors}
    arch = gguf_value(reader, "general.architecture", None)
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(GGUF_ARCHITECTURES)})")

    def key(name: str, default: Any = ModelLoadError) -> Any:
        value = gguf_value(reader, f"{arch}.{name}", None)
        if value is None:
            if default is ModelLoadError:
                raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}")
            return default
        return value

    hidden = int(key("embedding_length"))
    num_layers = int(key("block_count"))
    num_heads = int(_one_value("head_count", key("attention.head_count")))
    num_kv_heads = int(_one_value("head_count_kv", key("attention.head_count_kv", num_heads)))
    head_dim = int(key("attention.key_length", hidden // num_heads))
    value_dim = int(key("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ModelLoadError(f"GGUF key_length {head_dim} != value_length {value_dim} is not supported")
    rotary_dim = int(key("rope.dimension_count", head_dim))
    base = _f32(key("rope.freq_base", 10000.0))
    context = int(key("context_length", 2048))
    vocab = _embedding_rows(reader) or key("vocab_size", None) or len(
        gguf_value(reader, "tokenizer.ggml.tokens", []))
    window, layer_types = _layer_types(arch, key, num_layers, context)
    gemma = arch in ("gemma2", "gemma3")

    local_base = key("rope.freq_base_swa", None)
    rope_local_theta = None
    if arch == "gemma3":
        # Gemma 3's sliding layers always have their own base (llama.cpp's default 10000).
        rope_local_theta = _f32(local_base) if local_base is not None else _GEMMA3_LOCAL_ROPE_BASE
    elif local_base is not None and layer_types is not None and _f32(local_base) != base:
        rope_local_theta = _f32(local_base)

    query_pre_attn_scalar = None
    if gemma:
        # llama.cpp (gemma2.cpp / gemma3.cpp): the 27B models scale by hidden / heads.
        big = num_layers == _GEMMA_27B_LAYERS[arch]
        query_pre_attn_scalar = float(hidden // num_heads if big else head_dim)
    attn_cap = key("attn_logit_softcapping", None) if arch == "gemma2" else None
    final_cap = key("final_logit_softcapping", None)
    moe = _moe_fields(arch, key, tensor_names, num_layers)
    architecture = _LLAMA_WITH_EXPERTS if arch == "llama" and moe else GGUF_ARCHITECTURES[arch]
    rope_layers = None
    if arch == "smollm3" and num_layers >= _SMOLLM3_NO_ROPE_EVERY:
        rope_layers = tuple((il + 1) % _SMOLLM3_NO_ROPE_EVERY != 0 for il in range(num_layers))
    try:
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(_one_value("feed_forward_length", key("feed_forward_length"))),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rope_theta=base,
            rms_norm_eps=_f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
            max_position_embeddings=context,
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names or "blk.0.attn_qkv.bias" in tensor_names,
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id", None),
            eos_token_id=gguf_value(reader, "tokenizer.ggml.eos_token_id", None),
            rope_scaling=_rope_scaling(reader, key, tensor_names, base, rotary_dim, context),
            partial_rotary_factor=rotary_dim / head_dim,
            rope_layers=rope_layers,
            rope_local_theta=rope_local_theta,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            sandwich_norms=gemma,
            hidden_act="gelu_pytorch_tanh" if gemma else "silu",
            embedding_multiplier=hidden ** 0.5 if gemma else None,
            query_pre_attn_scalar=query_pre_attn_scalar,
            attn_logit_softcapping=None if not attn_cap else _f32(attn_cap),
            final_logit_softcapping=None if not final_cap else _f32(final_cap),
            sliding_window=window,
            layer_types=layer_types,
            mlp_bias="blk.0.ffn_down.bias" in tensor_names,
            **moe,
        )
    except ValueError as exc:
        raise ModelLoadError(f"GGUF metadata describes an invalid model: {exc}") from exc
