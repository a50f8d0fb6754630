"""What each Hugging Face family adds to the plain Llama config and checkpoint.

A family is one HFFamily entry: its architecture class names, the ModelConfig fields it sets
from config.json (on top of the common ones hf_loader reads for every family) and how its
checkpoint tensors map onto the decoder's (HF Llama) parameter names. Adding a family = one
entry here, plus a decoder piece and a ModelConfig field where it brings something new.

Defaults follow the transformers 5 config classes, for config.json files that leave a field
out (older saves): e.g. Gemma 2 soft-caps at 50 / 30 unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cadence.model.config import FULL_ATTENTION, SLIDING_ATTENTION
from cadence.model.errors import ModelLoadError

Tensors = Iterator[tuple[str, torch.Tensor]]
ConfigPieces = Callable[[dict[str, Any], str], dict[str, Any]]


@dataclass(frozen=True)
class HFFamily:
    name: str  # ModelConfig.architecture
    classes: tuple[str, ...]  # config.json "architectures" entries
    model_types: tuple[str, ...]  # config.json "model_type" values
    pieces: ConfigPieces  # (config.json, path) -> extra ModelConfig fields
    tie_word_embeddings: bool = False  # the config class's default
    # Checkpoint tensors -> the decoder's names and layouts (None: already the same).
    convert: Callable[[dict[str, Any], Tensors], Tensors] | None = None


def _all_layers(kind: str, cfg: dict[str, Any]) -> tuple[str, ...]:
    return (kind,) * cfg["num_hidden_layers"]


def _whole_model_window(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """Mistral, Phi-3: a sliding_window in config.json applies to every layer (HF builds one
    sliding mask for all). A window no shorter than max_position_embeddings can never exclude a
    key of a context the model takes, so it is left off (Phi-4-mini's 262144): full attention
    keeps such layers on the compiled attention kernels."""
    window = cfg.get("sliding_window")
    if not window or window >= cfg.get("max_position_embeddings", 2048):
        return {}
    return {"sliding_window": int(window), "layer_types": _all_layers(SLIDING_ATTENTION, cfg)}


def _qwen_window(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """Qwen2/3: sliding only with use_sliding_window, on layers >= max_window_layers unless
    layer_types says which."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    if not window:
        return {}
    types = cfg.get("layer_types") or [
        SLIDING_ATTENTION if i >= cfg.get("max_window_layers", 28) else FULL_ATTENTION
        for i in range(cfg["num_hidden_layers"])]
    if SLIDING_ATTENTION not in types:
        return {}
    return {"sliding_window": int(window), "layer_types": tuple(types)}


def _qwen2(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    # HF Qwen2 always has q/k/v biases (not the o projection).
    return {"attention_bias": True, **_qwen_window(cfg, path)}


def _qwen3(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    return {"qk_norm": True, **_qwen_window(cfg, path)}


def _llama(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    return {"mlp_bias": bool(cfg.get("mlp_bias", False))}


def _smollm3(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """SmolLM3: no_rope_layers[i] is 1 where layer i USES rope (HF: use_rope =
    no_rope_layers[layer_idx]); default every no_rope_layer_interval-th layer has none."""
    n = cfg["num_hidden_layers"]
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = cfg.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise ModelLoadError(f"{path}: no_rope_layers has {len(flags)} entries for {n} layers")
    pieces: dict[str, Any] = {"mlp_bias": bool(cfg.get("mlp_bias", False))}
    if not all(flags):
        pieces["rope_layers"] = tuple(bool(f) for f in flags)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    if window:
        types = cfg.get("layer_types") or [SLIDING_ATTENTION if not f else FULL_ATTENTION for f in flags]
        if SLIDING_ATTENTION in types:
            pieces.update(sliding_window=int(window), layer_types=tuple(types))
    return pieces


def _gemma(cfg: dict[str, Any], path: str, default_pattern: int, qk_norm: bool,
           softcaps: tuple[float | None, float | None]) -> dict[str, Any]:
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{path}: bidirectional Gemma attention (embedding models) is not supported")
    n = cfg["num_hidden_layers"]
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or default_pattern
    types = cfg.get("layer_types") or [
        SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n)]
    window = cfg.get("sliding_window")
    pieces: dict[str, Any] = {
        "sandwich_norms": True,
        "qk_norm": qk_norm,
        "hidden_act": cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        "embedding_multiplier": cfg["hidden_size"] ** 0.5,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", 256)),
        "attn_logit_softcapping": cfg.get("attn_logit_softcapping", softcaps[0]),
        "final_logit_softcapping": cfg.get("final_logit_softcapping", softcaps[1]),
    }
    if window and SLIDING_ATTENTION in types:
        pieces.update(sliding_window=int(window), layer_types=tuple(types))
    return pieces


def _gemma2(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    return _gemma(cfg, path, default_pattern=2, qk_norm=False, softcaps=(50.0, 30.0))


def _gemma3(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    return _gemma(cfg, path, default_pattern=6, qk_norm=True, softcaps=(None, None))


def _gemma_norms(cfg: dict[str, Any], tensors: Tensors) -> Tensors:
    """Gemma's RMSNorm multiplies by (1 + w); the decoder's by w: fold the 1 in, in float32
    (HF computes 1 + w in float32 too, so float32 models match exactly)."""
    for name, tensor in tensors:
        if name.endswith("norm.weight"):
            tensor = tensor.float() + 1.0
        yield name, tensor


def _phi3_split(cfg: dict[str, Any], tensors: Tensors) -> Tensors:
    """Phi-3 stores q/k/v as one qkv_proj [(Hq + 2 Hkv) * D, H] and gate/up as one gate_up_proj
    [2 I, H] (gate first); the decoder takes them apart and fuses them again its own way."""
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    for name, tensor in tensors:
        if name.endswith("self_attn.qkv_proj.weight") and tensor.shape[0] == sum(sizes):
            prefix = name[: -len("qkv_proj.weight")]
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split(sizes)):
                yield f"{prefix}{part}.weight", piece.contiguous()
        elif name.endswith("mlp.gate_up_proj.weight") and tensor.shape[0] % 2 == 0:
            prefix = name[: -len("gate_up_proj.weight")]
            gate, up = tensor.chunk(2)
            yield f"{prefix}gate_proj.weight", gate.contiguous()
            yield f"{prefix}up_proj.weight", up.contiguous()
        else:
            yield name, tensor


FAMILIES = (
    HFFamily("llama", ("LlamaForCausalLM",), ("llama",), _llama),
    HFFamily("mistral", ("MistralForCausalLM",), ("mistral",), _whole_model_window),
    HFFamily("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), _qwen2),
    HFFamily("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), _qwen3),
    HFFamily("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), _gemma2, tie_word_embeddings=True,
             convert=_gemma_norms),
    HFFamily("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), _gemma3, tie_word_embeddings=True,
             convert=_gemma_norms),
    HFFamily("phi3", ("Phi3ForCausalLM",), ("phi3",), _whole_model_window, convert=_phi3_split),
    HFFamily("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",), _smollm3, tie_word_embeddings=True),
)


def family_of(cfg: dict[str, Any], path: str) -> HFFamily:
    """The family config.json describes (its first "architectures" entry, else its model_type),
    or ModelLoadError naming it and listing the supported ones."""
    archs = cfg.get("architectures") or []
    for family in FAMILIES:
        if (archs and archs[0] in family.classes) or (not archs and cfg.get("model_type") in family.model_types):
            return family
    supported = sorted(c for f in FAMILIES for c in f.classes)
    what = f"architecture {archs[0]!r}" if archs else f"model_type {cfg.get('model_type')!r}"
    raise ModelLoadError(f"{path}: {what} is not supported (supported: {', '.join(supported)})")
