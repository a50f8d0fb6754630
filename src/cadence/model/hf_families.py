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


def _qwen3_moe(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3's layers with a routed MLP on the layers that are not in mlp_only_layers
    and are every decoder_sparse_step-th (HF Qwen3MoeDecoderLayer); the others dense of width
    intermediate_size. transformers 5 saves the expert count as num_local_experts, the Hub's
    configs as num_experts. Windows: HF's one window on every layer with use_sliding_window
    (unlike Qwen3's per-layer max_window_layers)."""
    n = cfg["num_hidden_layers"]
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    moe = tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n))
    if not any(moe):
        raise ModelLoadError(f"{path}: a Qwen3-MoE config without expert layers is not supported")
    # HF Qwen3-MoE: with use_sliding_window, one window on every layer (no max_window_layers).
    window = _whole_model_window(cfg, path) if cfg.get("use_sliding_window", False) else {}
    return {"qk_norm": True, **window, "num_experts": experts, "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
            "moe_layers": None if all(moe) else moe, "moe_round_routing_weights": True}


def _mixtral(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """Mixtral: Mistral's layers, every MLP routed over experts of width intermediate_size, the
    top-k weights always renormalised (HF MixtralTopKRouter)."""
    return {**_whole_model_window(cfg, path), "num_experts": int(cfg.get("num_local_experts", 8)),
            "num_experts_per_tok": int(cfg.get("num_experts_per_tok", 2)), "norm_topk_prob": True}


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


def _fused_experts(tensors: Tensors) -> Tensors:
    """Expert weights stored as 3-D tensors (transformers 5's in-memory layout:
    mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and mlp.experts.down_proj [E, H, I])
    as the per-expert projections the Hub's checkpoints hold (mlp.experts.E.gate_proj.weight ...)."""
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition("experts.")
        if tensor.dim() == 3 and leaf in ("gate_up_proj", "gate_up_proj.weight"):
            for e, (gate, up) in enumerate(t.chunk(2) for t in tensor.unbind(0)):
                yield f"{prefix}experts.{e}.gate_proj.weight", gate.contiguous()
                yield f"{prefix}experts.{e}.up_proj.weight", up.contiguous()
        elif tensor.dim() == 3 and leaf in ("down_proj", "down_proj.weight"):
            for e, down in enumerate(tensor.unbind(0)):
                yield f"{prefix}experts.{e}.down_proj.weight", down.contiguous()
        else:
            yield name, tensor


def _qwen3_moe_tensors(cfg: dict[str, Any], tensors: Tensors) -> Tensors:
    return _fused_experts(tensors)


# Mixtral's checkpoint names: block_sparse_moe (the MoE MLP), experts' w1 / w3 / w2 (gate / up /
# down, as in Mistral's reference code).
_MIXTRAL_RENAMES = ((".block_sparse_moe.", ".mlp."), (".w1.weight", ".gate_proj.weight"),
                    (".w3.weight", ".up_proj.weight"), (".w2.weight", ".down_proj.weight"))


def _mixtral_tensors(cfg: dict[str, Any], tensors: Tensors) -> Tensors:
    def renamed() -> Tensors:
        for name, tensor in tensors:
            if ".block_sparse_moe." in name:
                for old, new in _MIXTRAL_RENAMES:
                    name = name.replace(old, new)
            yield name, tensor

    return _fused_experts(renamed())


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
    HFFamily("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), _qwen3_moe, convert=_qwen3_moe_tensors),
    HFFamily("mixtral", ("MixtralForCausalLM",), ("mixtral",), _mixtral, convert=_mixtral_tensors),
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
