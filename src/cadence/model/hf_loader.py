"""Load a model of any supported family from a Hugging Face folder (config.json + *.safetensors +
tokenizer); what each family adds is in hf_families."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open

from cadence.model.config import ROPE_TYPES, ModelConfig, RopeScaling
from cadence.model.errors import ModelLoadError
from cadence.model.hf_families import family_of
from cadence.model.llama import LlamaForCausalLM
from cadence.model.tokenizer import Tokenizer, TokenizerError
from cadence.model.weights import build_model


ROPE_LOCAL, ROPE_GLOBAL = "sliding_attention", "full_attention"  # nested rope_parameters keys


def _rope_dict(cfg: dict[str, Any], kind: str) -> dict[str, Any]:
    """The rope settings of one layer kind: transformers 5's rope_parameters (flat, or nested by
    layer type as Gemma 3 saves it), else the older rope_scaling (which then applies to global
    layers only)."""
    params = cfg.get("rope_parameters") or {}
    if ROPE_GLOBAL in params or ROPE_LOCAL in params:
        return dict(params.get(kind) or {})
    if params:
        return dict(params)
    if kind == ROPE_LOCAL:
        return {}
    return dict(cfg.get("rope_scaling") or {})


def _rope_scaling(cfg: dict[str, Any], rope: dict[str, Any], path: str) -> RopeScaling | None:
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(f"{path}: rope scaling {rope_type!r} is not supported "
                             f"(supported: {', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return None
    max_positions = cfg.get("max_position_embeddings", 2048)
    # HF: a top-level original_max_position_embeddings (Phi-3) wins over the rope dict's.
    original = cfg.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    if original is None and rope_type in ("llama3", "yarn", "longrope"):
        original = max_positions
    factor = rope.get("factor")
    if factor is None:
        if rope_type in ("linear", "dynamic", "llama3"):
            raise ModelLoadError(f"{path}: rope scaling {rope_type!r} needs a factor")
        factor = max_positions / original  # yarn, longrope: HF's implicit factor

    def floats(key: str) -> tuple[float, ...] | None:
        return tuple(float(v) for v in rope[key]) if rope.get(key) is not None else None

    optional = {k: rope[k] for k in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                                     "truncate") if rope.get(k) is not None}
    try:
        return RopeScaling(rope_type=rope_type, factor=float(factor), original_max_position_embeddings=original,
                           mscale=rope.get("mscale"), mscale_all_dim=rope.get("mscale_all_dim"),
                           attention_factor=rope.get("attention_factor"), short_factor=floats("short_factor"),
                           long_factor=floats("long_factor"), **optional)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: invalid rope scaling {rope!r}: {exc}") from exc


def _rope_fields(cfg: dict[str, Any], family: str, path: str) -> dict[str, Any]:
    """rope_theta, rope_scaling, partial_rotary_factor and (Gemma 3) rope_local_theta."""
    rope = _rope_dict(cfg, ROPE_GLOBAL)
    default_theta = 1_000_000.0 if family == "gemma3" else 10000.0
    fields: dict[str, Any] = {
        "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", default_theta))),
        "rope_scaling": _rope_scaling(cfg, rope, path),
        "partial_rotary_factor": float(rope.get("partial_rotary_factor",
                                                cfg.get("partial_rotary_factor", 1.0))),
    }
    if family == "gemma3":
        local = _rope_dict(cfg, ROPE_LOCAL)
        if _rope_scaling(cfg, local, path) is not None:
            raise ModelLoadError(f"{path}: rope scaling on sliding-window layers is not supported")
        fields["rope_local_theta"] = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0)))
    return fields


def config_from_hf(cfg: dict[str, Any], path: str) -> ModelConfig:
    """The ModelConfig of an HF config.json: the fields every family shares, then its family's
    own (hf_families). ModelLoadError names what is unsupported or invalid."""
    family = family_of(cfg, path)
    eos = cfg.get("eos_token_id")
    num_heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    try:
        fields = dict(
            architecture=family.name,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", family.tie_word_embeddings)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
            **_rope_fields(cfg, family.name, path),
        )
        fields.update(family.pieces(cfg, path))
        return ModelConfig(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: config.json describes an invalid or unsupported model: {exc!r}") from exc


def _tensors(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file}: unreadable safetensors file: {exc}") from exc


# Stored dtype names: config.json's `dtype` (transformers 5) / `torch_dtype`, safetensors' header.
_CONFIG_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def hf_checkpoint_dtype(path: str) -> torch.dtype | None:
    """The dtype an HF folder stores its weights in: config.json's `dtype` / `torch_dtype` (what
    vLLM's `--dtype auto` reads), else the first floating tensor's dtype in the safetensors
    files; None when neither says (e.g. an fp8 or integer-only checkpoint)."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError):
        cfg = {}
    for key in ("dtype", "torch_dtype"):
        named = cfg.get(key) if isinstance(cfg, dict) else None
        if isinstance(named, str) and named in _CONFIG_DTYPES:
            return _CONFIG_DTYPES[named]
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    stored = _SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype())
                    if stored is not None:
                        return stored
        except (SafetensorError, OSError):
            return None
    return None


def load_hf_dir(path: str, dtype: torch.dtype,
                device: torch.device) -> tuple[LlamaForCausalLM, ModelConfig, Tokenizer]:
    """Model, config and tokenizer from an HF checkpoint folder."""
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelLoadError(f"{path}: no config.json (expected a Hugging Face model folder)")
    try:
        with open(config_file, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_file}: invalid JSON: {exc}") from exc
    config = config_from_hf(cfg, path)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights (other formats are not supported)")
    family = family_of(cfg, path)
    tensors = _tensors(files)
    if family.convert is not None:
        tensors = family.convert(cfg, tensors)
    model = build_model(config, tensors, dtype, device, path)
    try:
        tokenizer = Tokenizer.from_hf_dir(path, vocab_size=config.vocab_size)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return model, config, tokenizer
