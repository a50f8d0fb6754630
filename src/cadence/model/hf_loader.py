"""Load a Llama-family model from a Hugging Face folder (config.json + *.safetensors + tokenizer)."""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.llama import LlamaForCausalLM
from cadence.model.tokenizer import Tokenizer, TokenizerError
from cadence.model.weights import build_model

logger = logging.getLogger(__name__)

_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


def _rope_theta(cfg: dict[str, Any]) -> float:
    # transformers 5 nests rope settings under rope_parameters; older configs keep rope_theta flat.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ModelLoadError(f"rope scaling {rope_type!r} is not supported")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def config_from_hf(cfg: dict[str, Any], path: str) -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = _ARCHITECTURES.get(archs[0]) if archs else None
    if arch is None:
        raise ModelLoadError(
            f"{path}: architecture {archs!r} is not supported (supported: {sorted(_ARCHITECTURES)})"
        )
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", arch == "mistral"):
        logger.warning("%s: sliding-window attention is ignored (full attention is used)", path)
    eos = cfg.get("eos_token_id")
    num_heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rope_theta=_rope_theta(cfg),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: config.json describes an invalid model: {exc!r}") from exc


def _tensors(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file}: unreadable safetensors file: {exc}") from exc


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
    model = build_model(config, _tensors(files), dtype, device, path)
    try:
        tokenizer = Tokenizer.from_hf_dir(path, vocab_size=config.vocab_size)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return model, config, tokenizer
