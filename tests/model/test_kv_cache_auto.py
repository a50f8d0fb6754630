"""--kv-cache-dtype auto: the cache a llama.cpp or vLLM user of the same checkpoint gets.

Under float32 compute a GGUF file gets float16 (llama.cpp's default KV type), a Hugging Face
checkpoint its stored 16-bit dtype (vLLM's "model dtype"), a float32 checkpoint float32; 16-bit
compute keeps its own dtype; explicit values are taken as asked. The loader records which kind
of checkpoint it read (LoadedModel.checkpoint_format / checkpoint_dtype).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.model.hf_loader import hf_checkpoint_dtype
from cadence.model.kv_cache import auto_kv_cache_dtype, kv_cache_dtype, loaded_kv_cache_dtype
from cadence.model.loader import load_model

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


@pytest.mark.parametrize("compute, fmt, stored, expected", [
    (F32, "gguf", None, F16),   # every GGUF on CPU: llama.cpp's f16 KV
    (F32, "hf", F32, F32),      # a float32 checkpoint keeps float32
    (F32, "hf", BF16, BF16),    # vLLM: the model's dtype
    (F32, "hf", F16, F16),
    (F32, "hf", None, F32),     # stored dtype unknown (fp8 / integer-only): float32
    (F32, "", BF16, F32),       # a model built in memory: its compute dtype
    (BF16, "gguf", None, BF16),  # 16-bit compute: unchanged
    (BF16, "hf", F16, BF16),
    (BF16, "hf", F32, BF16),
    (F16, "hf", BF16, F16),
])
def test_auto_by_checkpoint_kind(compute, fmt, stored, expected):
    assert auto_kv_cache_dtype(compute, fmt, stored) == expected
    assert kv_cache_dtype("auto", compute, fmt, stored) == expected


def test_explicit_values_win_over_the_checkpoint():
    assert kv_cache_dtype("float32", F32, "gguf") == F32
    assert kv_cache_dtype("bfloat16", F32, "gguf") == BF16
    assert kv_cache_dtype("float16", F32, "hf", BF16) == F16
    assert kv_cache_dtype("float32", F32, "hf", BF16) == F32
    with pytest.raises(ValueError, match="float16 is not supported with a bfloat16 model"):
        kv_cache_dtype("float16", BF16, "gguf")
    with pytest.raises(ValueError, match="float32 is not supported with a bfloat16 model"):
        kv_cache_dtype("float32", BF16, "hf", BF16)


def _copy(src: str, tmp_path, name: str = "model") -> str:
    dst = str(tmp_path / name)
    shutil.copytree(src, dst)
    return dst


def _set_config(path: str, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    with open(file, "w") as f:
        json.dump(cfg, f)


def _store_weights_as(path: str, dtype: torch.dtype) -> None:
    file = os.path.join(path, "model.safetensors")
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(file).items()}
    save_file(state, file, metadata={"format": "pt"})


def test_hf_stored_dtype_from_config_then_tensors(tiny_llama_dir, tmp_path):
    path = _copy(tiny_llama_dir, tmp_path)
    assert hf_checkpoint_dtype(path) == F32  # save_pretrained of a float32 model says so
    _set_config(path, dtype="bfloat16")  # transformers 5's key
    assert hf_checkpoint_dtype(path) == BF16
    _set_config(path, dtype=None, torch_dtype="float16")  # the older key
    assert hf_checkpoint_dtype(path) == F16
    _set_config(path, torch_dtype=None)  # neither: the tensors' own dtype
    assert hf_checkpoint_dtype(path) == F32
    _store_weights_as(path, BF16)
    assert hf_checkpoint_dtype(path) == BF16


def test_loaded_hf_checkpoint_resolves_its_stored_dtype(tiny_llama_dir, tmp_path):
    f32 = load_model(tiny_llama_dir, dtype="float32", device="cpu")
    assert (f32.checkpoint_format, f32.checkpoint_dtype) == ("hf", F32)
    assert loaded_kv_cache_dtype("auto", f32) == F32
    path = _copy(tiny_llama_dir, tmp_path, "bf16")
    _store_weights_as(path, BF16)
    _set_config(path, dtype="bfloat16")
    for compute, expected in ((F32, BF16), (BF16, BF16)):
        loaded = load_model(path, dtype=compute, device="cpu", quantization="none")
        assert loaded.dtype == compute and loaded.checkpoint_dtype == BF16
        assert loaded_kv_cache_dtype("auto", loaded) == expected
    assert loaded_kv_cache_dtype("float32", load_model(path, dtype="float32", device="cpu")) == F32


def test_loaded_gguf_resolves_float16(tmp_path):
    from .random_gguf import Q, write_random_gguf

    path = write_random_gguf(str(tmp_path / "m.gguf"), Q.Q4_K)
    loaded = load_model(path, dtype="auto", device="cpu", quantization="gguf")
    assert loaded.dtype == F32 and loaded.checkpoint_format == "gguf"
    assert loaded_kv_cache_dtype("auto", loaded) == F16
    assert loaded_kv_cache_dtype("float32", loaded) == F32
