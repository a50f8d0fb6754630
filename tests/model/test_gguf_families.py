"""GGUF files of every family, written as llama.cpp's converter writes them, load back to the
config the HF folder gives and to transformers' float32 logits."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from cadence.model.config import RopeScaling
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_config import config_from_gguf, llama3_factors, llama3_rope_scaling
from cadence.model.gguf_fields import GGUFFile
from cadence.model.hf_loader import config_from_hf
from cadence.model.loader import load_model

from .gguf_family_checkpoints import GGUF_FAMILIES, build_gguf_family_checkpoint
from .gguf_helpers import write_tiny_gguf
from .paged_helpers import paged_logits

TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=GGUF_FAMILIES)
def family_files(request, tmp_path_factory):
    """(family, HF folder, GGUF file of the same weights)."""
    hf_dir = build_gguf_family_checkpoint(str(tmp_path_factory.mktemp(request.param)), request.param)
    return request.param, hf_dir, write_tiny_gguf(hf_dir, os.path.join(hf_dir, "model.gguf"))


def _hf_config(hf_dir: str):
    with open(os.path.join(hf_dir, "config.json")) as f:
        return config_from_hf(json.load(f), hf_dir)


def test_config_equals_the_hf_folders(family_files):
    family, hf_dir, path = family_files
    expected = _hf_config(hf_dir)
    # GGUF has no "mistral": llama.cpp's converter writes Mistral as llama.
    expected = dataclasses.replace(
        expected, architecture="llama" if expected.architecture == "mistral" else expected.architecture)
    assert config_from_gguf(GGUFFile(path)) == expected


def test_logits_match_transformers(family_files):
    family, hf_dir, path = family_files
    ours = load_model(path, dtype="float32", device="cpu")
    _assert_matches_transformers(family, hf_dir, ours)


def test_native_path_matches_transformers(family_files):
    """The GGUF-native path (`--quantization gguf`: each matrix a GGUFLinear on the file's own
    blocks, float32 ones here) computes every family's pieces as the float model does: Qwen3's
    q/k norms, Gemma's norms and soft-capping, Phi-3's fused projections taken apart."""
    from cadence.model.gguf_modules import GGUFLinear

    family, hf_dir, path = family_files
    ours = load_model(path, device="cpu", quantization="gguf")
    assert any(isinstance(m, GGUFLinear) for m in ours.model.modules())
    _assert_matches_transformers(family, hf_dir, ours)


@pytest.mark.parametrize("base, dim, factor, original", [
    (500000.0, 128, 8.0, 8192),  # Llama 3.1
    (500000.0, 64, 32.0, 8192),  # Llama 3.2 1B
    (10000.0, 16, 8.0, 64),  # the tiny test model: two smoothed entries
    (10000.0, 16, 4.0, 48),
])
def test_llama3_rope_factors_give_back_their_parameters(base, dim, factor, original):
    factors = llama3_factors(base, dim, factor, 1.0, 4.0, original)
    scaling = llama3_rope_scaling(factors, base, dim)
    assert scaling == RopeScaling(rope_type="llama3", factor=factor, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=original)


def test_llama3_factors_no_scaling_reproduces_are_an_error():
    factors = llama3_factors(10000.0, 16, 8.0, 1.0, 4.0, 64)
    factors[2] *= 1.01
    with pytest.raises(ModelLoadError, match="no llama3 scaling"):
        llama3_rope_scaling(factors, 10000.0, 16)


GEMMA3_FILE = "/work/cache/gemma/gemma-3-270m-q4_k_m.gguf"


def test_real_gemma3_file_config():
    """Gemma 3 270M as llama.cpp's converter wrote it (Q4_K_M): what llama.cpp derives."""
    if not os.path.isfile(GEMMA3_FILE):
        pytest.skip(f"{GEMMA3_FILE} is only on the development machine")
    config = config_from_gguf(GGUFFile(GEMMA3_FILE))
    assert (config.architecture, config.vocab_size, config.num_layers, config.head_dim) == (
        "gemma3", 262144, 18, 256)
    assert config.layer_types == tuple(
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18))
    assert (config.sliding_window, config.rope_theta, config.rope_local_theta) == (512, 1e6, 1e4)
    assert config.query_pre_attn_scalar == 256.0 and config.embedding_multiplier == 640 ** 0.5
    assert config.qk_norm and config.sandwich_norms and config.tie_word_embeddings
    assert config.hidden_act == "gelu_pytorch_tanh" and config.rms_norm_eps == 1e-6
    assert config.rope_scaling is None and config.final_logit_softcapping is None


LLAMA_COMPLETION = "/work/cache/llamacpp/build/bin/llama-completion"


def test_real_gemma3_file_greedy_text_matches_llama_cpp():
    """Gemma 3 270M (Q4_K_M: Q8_0, Q5_0, Q4_K, Q6_K tensors) decoded to float32 continues a
    prompt greedily with llama.cpp's words."""
    import subprocess

    if not os.path.isfile(GEMMA3_FILE) or not os.access(LLAMA_COMPLETION, os.X_OK):
        pytest.skip("the Gemma 3 file and llama.cpp's llama-completion are only on the development machine")
    ours = load_model(GEMMA3_FILE, dtype="float32", device="cpu")
    prompt, steps = "The capital of France is", 8
    ids = ours.tokenizer.encode(prompt)
    for _ in range(steps):
        ids.append(int(paged_logits(ours, ids, chunk_size=64, pool_size=64)[-1].argmax()))
    text = ours.tokenizer.decode(ids[-steps:])
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LLAMA_COMPLETION))
    run = subprocess.run([LLAMA_COMPLETION, "-m", GEMMA3_FILE, "-p", prompt, "-n", str(steps), "--temp", "0",
                          "-no-cnv", "--no-display-prompt", "-t", "2"],
                         capture_output=True, env=env, timeout=300, check=True)
    assert text.rstrip("\n") == run.stdout.decode().rstrip("\n")


@pytest.mark.parametrize("keys, expected", [
    ({"rope.scale_linear": 2.0}, RopeScaling(rope_type="linear", factor=2.0)),  # older files
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0},  # original context: the model's
     RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=512)),
    ({"rope.scaling.type": "none"}, None),
])
def test_rope_scaling_key_spellings(tiny_llama_dir, tmp_path, keys, expected):
    path = write_tiny_gguf(tiny_llama_dir, str(tmp_path / "base.gguf"))
    reader = GGUFFile(path)
    reader.fields.update({f"llama.{k}": v for k, v in keys.items()})
    assert config_from_gguf(reader).rope_scaling == expected
    reader.fields["llama.rope.scaling.type"] = "longrope-ish"
    with pytest.raises(ModelLoadError, match=r"rope scaling 'longrope-ish' is not supported \(supported: "):
        config_from_gguf(reader)


def _assert_matches_transformers(family: str, hf_dir: str, ours) -> None:
    """Logits of a 29-token prompt, paged in chunks of 11, within TOLERANCE of transformers'."""
    import transformers

    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, ours.config.vocab_size, 29)]
    with torch.inference_mode():
        expected = theirs(torch.tensor([prompt])).logits[0].float()
    got = paged_logits(ours, prompt, chunk_size=11)
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, f"{family}: max abs diff {diff}"
