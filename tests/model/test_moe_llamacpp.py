"""Mixture-of-experts checkpoints through llama.cpp's own route: a tiny random Qwen3-MoE and
Mixtral (SmolLM2's tokenizer) converted by llama.cpp's convert_hf_to_gguf.py (F32), and a Q8_0
made from it by llama-quantize. cadence loads the converter's file with transformers' logits,
and continues a prompt greedily with llama-completion's words on both files. Skipped where the
llama.cpp cache is not there (CI: the writer in gguf_helpers.py covers the layout there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence.model.loader import load_model
from tests.bench.bench_modules import load_benchmark

from .llamacpp_tools import completion_text, convert_f32, quantize, requires_llamacpp
from .paged_helpers import paged_logits

PROMPT = "The capital of France is Paris, and the capital of Spain is"
STEPS = 8


hf_shapes = load_benchmark("hf_shapes")
pytestmark = requires_llamacpp


def _checkpoint(folder: Path, family: str):
    """A random HF model of `family` with SmolLM2's tokenizer, saved in folder; the model."""
    import transformers

    from tests.conftest import _randomize

    folder.mkdir(parents=True)
    bos, eos = hf_shapes.write_tokenizer(folder)
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                  initializer_range=0.1, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False)
    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, norm_topk_prob=True)
        model_class = transformers.Qwen3MoeForCausalLM
    else:
        config = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
        model_class = transformers.MixtralForCausalLM
    torch.manual_seed(0)
    model = model_class(config)
    _randomize(model)
    model.eval().save_pretrained(folder)
    return model



def _llama_cpp_text(path: Path) -> str:
    return completion_text(path, PROMPT, STEPS).rstrip("\n")


def _greedy_text(loaded) -> str:
    ids = loaded.tokenizer.encode(PROMPT)
    start = len(ids)
    for _ in range(STEPS):
        ids.append(int(paged_logits(loaded, ids, chunk_size=64)[-1].argmax()))
    return loaded.tokenizer.decode(ids[start:]).rstrip("\n")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_converted_file_matches_transformers_and_llama_cpp(family, tmp_path):
    model = _checkpoint(tmp_path / "hf", family)
    f32 = tmp_path / "f32.gguf"
    convert_f32(tmp_path / "hf", f32)
    ours = load_model(str(f32), dtype="float32", device="cpu", quantization="none")
    assert ours.config.architecture == family and ours.config.num_experts == 4
    prompt = ours.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = model(torch.tensor([prompt])).logits[0]
    assert (paged_logits(ours, prompt, chunk_size=5) - expected).abs().max().item() < 1e-4
    assert _greedy_text(ours) == _llama_cpp_text(f32)
    q8 = tmp_path / "q8_0.gguf"
    quantize(f32, q8, "Q8_0")
    native = load_model(str(q8), device="cpu", quantization="gguf")
    assert _greedy_text(native) == _llama_cpp_text(q8)
