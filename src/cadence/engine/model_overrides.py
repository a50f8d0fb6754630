"""EngineConfig options that adjust a loaded model: --tokenizer, --chat-template,
--kv-cache-dtype, --quantization, and --generation-config's default sampling values."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from cadence.engine.config import EngineConfig

# generation_config.json keys -> SamplingParams fields (HF's names on the left).
_GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                    "max_new_tokens": "max_tokens"}


def apply_model_overrides(loaded: Any, cfg: EngineConfig) -> Any:
    """The LoadedModel with cfg's tokenizer / chat template; ValueError on unsupported values."""
    from cadence.model.tokenizer import Tokenizer

    tokenizer = loaded.tokenizer
    if cfg.tokenizer:
        path = os.path.expanduser(cfg.tokenizer)
        if os.path.isfile(path):
            path = os.path.dirname(path)
        tokenizer = Tokenizer.from_hf_dir(path, vocab_size=loaded.config.vocab_size)
    if cfg.chat_template:
        source = cfg.chat_template
        if os.path.isfile(os.path.expanduser(source)):
            with open(os.path.expanduser(source), encoding="utf-8") as f:
                source = f.read()
        tokenizer = tokenizer.with_chat_template(source)
    from cadence.model.kv_cache import loaded_kv_cache_dtype

    loaded_kv_cache_dtype(cfg.kv_cache_dtype, loaded)  # a pair no path serves fails here
    if tokenizer is not loaded.tokenizer:
        loaded = dataclasses.replace(loaded, tokenizer=tokenizer)
    return loaded


def generation_defaults(cfg: EngineConfig) -> dict[str, Any]:
    """SamplingParams defaults from generation_config.json (--generation-config)."""
    if cfg.generation_config == "vllm":
        return {}
    if cfg.generation_config == "auto":
        if not cfg.model or not os.path.isdir(os.path.expanduser(cfg.model)):
            return {}  # a GGUF file carries no generation_config.json
        folder = os.path.expanduser(cfg.model)
    else:
        folder = os.path.expanduser(cfg.generation_config)
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if cfg.generation_config == "auto":
            return {}
        raise ValueError(f"--generation-config: no generation_config.json in {folder}")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {ours: data[hf] for hf, ours in _GENERATION_KEYS.items()
            if isinstance(data.get(hf), int | float) and not isinstance(data.get(hf), bool)}
