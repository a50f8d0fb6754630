"""load_model: HF folders and GGUF files load to the right model; bad inputs give ModelLoadError."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.model.fused_decode import has_f32_stack
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kernels.isa import native_bf16
from cadence.model.loader import ModelLoadError, load_model, resolve_device, resolve_dtype

from .gguf_helpers import write_tiny_gguf
from .paged_helpers import paged_logits


def copy_dir(src: str, tmp_path) -> str:
    dst = str(tmp_path / "model")
    shutil.copytree(src, dst)
    return dst


def edit_config(path: str, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(file, "w") as f:
        json.dump(cfg, f)


def edit_weights(path: str, edit) -> None:
    file = os.path.join(path, "model.safetensors")
    state = load_file(file)
    edit(state)
    save_file(state, file)


def test_hf_folder_loads_with_config_and_name(tiny_qwen2_dir):
    loaded = load_model(tiny_qwen2_dir, dtype="float32", device="cpu")
    assert loaded.config.architecture == "qwen2" and loaded.config.attention_bias
    assert loaded.config.tie_word_embeddings
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert loaded.dtype == torch.float32 and loaded.device.type == "cpu"
    assert loaded.name == os.path.basename(tiny_qwen2_dir)


def test_auto_dtype_follows_native_bf16(tiny_llama_dir):
    # bf16 where the CPU computes it natively (AVX512-BF16), float32 elsewhere (torch's bf16
    # matmul is a slow fallback there), with int8 weights where the float32 fast path runs.
    loaded = load_model(tiny_llama_dir)
    assert loaded.dtype == (torch.bfloat16 if native_bf16() else torch.float32)
    kernels = load_cpu_kernels()
    if loaded.dtype == torch.float32 and kernels is not None and has_f32_stack(kernels):
        assert loaded.model.decode_weight_format == "int8"
    assert load_model(tiny_llama_dir, dtype="float32").model.decode_weight_format == "float32"
    assert load_model(tiny_llama_dir, quantization="bf16").dtype == torch.float32
    with pytest.raises(ValueError, match="unknown quantization"):
        load_model(tiny_llama_dir, quantization="q3")
    with pytest.raises(ValueError, match="float32 compute"):
        load_model(tiny_llama_dir, dtype="bfloat16", quantization="int8")
    assert resolve_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3")
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.parametrize("which", ["llama", "qwen2"])
def test_gguf_of_tiny_model_matches_hf_folder(which, tiny_llama_dir, tiny_qwen2_dir, tmp_path):
    """A GGUF written like llama.cpp does (q/k permuted for llama) loads back to the same logits."""
    hf_dir = tiny_llama_dir if which == "llama" else tiny_qwen2_dir
    path = write_tiny_gguf(hf_dir, str(tmp_path / f"tiny-{which}.gguf"))
    from_gguf = load_model(path, dtype="float32", device="cpu")
    from_hf = load_model(hf_dir, dtype="float32", device="cpu")
    # GGUF stores eps as float32; the tiny HF config has no BOS.
    assert from_gguf.config.rms_norm_eps == pytest.approx(from_hf.config.rms_norm_eps)
    assert from_gguf.config == dataclasses.replace(
        from_hf.config, bos_token_id=None, rms_norm_eps=from_gguf.config.rms_norm_eps)
    assert from_gguf.name == f"tiny-{which}"
    prompt = list(range(3, 40))
    diff = (paged_logits(from_gguf, prompt, 5) - paged_logits(from_hf, prompt, 5)).abs().max()
    assert diff < 1e-5
    text = "Hello world! 😀"
    assert from_gguf.tokenizer.encode(text) == from_hf.tokenizer.encode(text)
    assert from_gguf.tokenizer.chat_template == from_hf.tokenizer.chat_template


def test_missing_path():
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("/nonexistent/model.gguf")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_unknown_hf_architecture(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    edit_config(path, architectures=["GPTNeoXForCausalLM"])
    with pytest.raises(ModelLoadError, match="not supported"):
        load_model(path)


def test_unsupported_rope_scaling(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    edit_config(path, rope_parameters={"rope_type": "mrope", "rope_theta": 10000.0, "factor": 4.0})
    with pytest.raises(ModelLoadError, match="rope scaling 'mrope' is not supported.*yarn, longrope"):
        load_model(path)


def test_corrupt_config_json(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ModelLoadError, match="invalid JSON"):
        load_model(path)


def test_mis_shaped_tensor(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    edit_weights(path, lambda s: s.__setitem__(name, s[name][:-1].clone()))
    with pytest.raises(ModelLoadError, match=r"up_proj.weight.*shape \(127, 64\), expected \(128, 64\)"):
        load_model(path)


def test_missing_tensor(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    edit_weights(path, lambda s: s.pop("model.norm.weight"))
    with pytest.raises(ModelLoadError, match="missing tensors.*model.norm.weight"):
        load_model(path)


def test_unexpected_tensor(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    edit_weights(path, lambda s: s.__setitem__("model.extra.weight", torch.zeros(2)))
    with pytest.raises(ModelLoadError, match="unexpected tensor 'model.extra.weight'"):
        load_model(path)


def test_non_finite_tensor(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    name = "model.layers.0.self_attn.v_proj.weight"

    def poison(state):
        state[name] = state[name].clone()
        state[name][0, 0] = float("nan")

    edit_weights(path, poison)
    with pytest.raises(ModelLoadError, match="NaN"):
        load_model(path)


def test_corrupt_safetensors(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(path)


def test_no_weights(tiny_llama_dir, tmp_path):
    path = copy_dir(tiny_llama_dir, tmp_path)
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not gguf" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        load_model(str(path))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="expected a .gguf file"):
        load_model(str(other))


def test_unknown_gguf_architecture(tiny_llama_dir, tmp_path):
    path = write_tiny_gguf(tiny_llama_dir, str(tmp_path / "odd.gguf"), arch="gptneox")
    with pytest.raises(ModelLoadError, match="GGUF architecture 'gptneox' is not supported"):
        load_model(path)


def test_mis_shaped_gguf_tensor(tiny_llama_dir, tmp_path):
    bad = {"blk.0.ffn_gate.weight": np.zeros((128, 60), dtype=np.float32)}
    path = write_tiny_gguf(tiny_llama_dir, str(tmp_path / "bad.gguf"), tensor_overrides=bad)
    with pytest.raises(ModelLoadError, match="gate_proj.weight.*expected \\(128, 64\\)"):
        load_model(path)


def test_engine_passes_quantization_to_the_loader(tiny_llama_d64_dir):
    from cadence.engine.llm import LLM

    llm = LLM(model=tiny_llama_d64_dir, quantization="bf16")
    model = llm.engine.executor.model
    assert model.lm_head.weight.dtype == torch.float32 and model.decode_weight_format == "bf16"


@pytest.mark.parametrize("layer_type, fmt", [("Q4_1", "int4"), ("Q4_0", "int4"), ("Q8_0", "int8"), (None, None)])
def test_auto_keeps_a_quantized_gguf_in_its_own_format(tiny_llama_d64_dir, tmp_path, layer_type, fmt):
    """--dtype auto with --quantization auto: a GGUF whose layers are stored in 4 or 8 bits runs
    in that format (int4, int8) on the float32 fast path, as llama.cpp runs such a file; a
    float GGUF keeps the dtype rule; explicit settings win."""
    import gguf

    from cadence.model.fused_decode import has_f32_stack
    from cadence.model.gguf_loader import gguf_weight_format
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    qtype = getattr(gguf.GGMLQuantizationType, layer_type) if layer_type else None
    path = write_tiny_gguf(tiny_llama_d64_dir, str(tmp_path / "q.gguf"), layer_type=qtype)
    assert gguf_weight_format(path) == fmt
    loaded = load_model(path, device="cpu")
    kernels = load_cpu_kernels()
    if fmt is not None and kernels is not None and has_f32_stack(kernels):
        assert loaded.dtype == torch.float32 and loaded.model.decode_weight_format == fmt
    else:
        assert loaded.dtype == resolve_dtype("auto", "cpu")
        assert getattr(loaded.model, "decode_weight_format", "float32") != "int4"
    # An explicit dtype or quantization is not overridden by the file.
    explicit = load_model(path, dtype="float32", device="cpu")
    assert getattr(explicit.model, "decode_weight_format", "float32") == "float32"
    assert gguf_weight_format(str(tmp_path / "missing.gguf")) is None


def test_auto_keeps_a_large_q8_file_on_its_own_blocks(tiny_llama_d64_dir, tmp_path, monkeypatch):
    """Past the memory budget (the widened float32 copy's load peak over half of what is
    available) `--quantization auto` computes an int4/int8 GGUF file on its own blocks instead
    of widening it: an 8B Q8_0 file widened would not fit 24 GiB."""
    import gguf

    from cadence.model import loader
    from cadence.model.fused_decode import has_f32_stack
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None or not has_f32_stack(kernels):
        pytest.skip("no float32 fused stack on this CPU: auto never widens")
    path = write_tiny_gguf(tiny_llama_d64_dir, str(tmp_path / "q.gguf"), layer_type=gguf.GGMLQuantizationType.Q8_0)
    elements = sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(path).tensors)
    assert loader.widened_copy_fits(path, available_bytes=2 * 8 * elements)
    assert not loader.widened_copy_fits(path, available_bytes=2 * 8 * elements - 8)
    assert loader.file_weight_format(path, torch.device("cpu")) == "int8"
    monkeypatch.setattr(loader, "host_available_bytes", lambda: 8 * elements)
    assert loader.file_weight_format(path, torch.device("cpu")) == "gguf"
    from cadence.model.gguf_modules import GGUFLinear

    on_blocks = load_model(path, device="cpu")
    assert isinstance(on_blocks.model.lm_head, GGUFLinear)  # the file's blocks, not float32
    assert on_blocks.model.decode_weight_format == "gguf"
