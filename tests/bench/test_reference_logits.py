"""benchmarks/reference_logits.py and the chunk rule of benchmarks/perplexity_vs_llamacpp.py.

The float64 reference of a GGUF file must be transformers' model (it judges cadence and
llama.cpp): checked on tiny Qwen3 and Llama checkpoints whose heads are wider than
hidden / heads (Qwen3-4B's q is 4096 wide on a hidden 2560), Qwen3 with its q/k norms and NEOX
rope, Llama with the converter's permuted q/k and normal rope. cadence's GGUF-native path on
the file's float32 blocks then matches the reference layer by layer. And the benchmarks score
llama-perplexity's inputs: BOS in place of a chunk's first token only where the vocabulary adds
BOS (replacing it always made the Qwen3-4B shape's +18.7% against llama.cpp)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cadence.model.gguf_fields import GGUFFile
from cadence.model.gguf_tokenizer import tokenizer_from_gguf
from cadence.model.loader import load_model
from tests.bench.bench_modules import load_benchmark
from tests.model.family_checkpoints import save_random_checkpoint
from tests.model.gguf_helpers import write_tiny_gguf


perplexity = load_benchmark("perplexity_vs_llamacpp")
reference = load_benchmark("reference_logits")

# hidden 64, 4 heads of 32 (q 128 wide), GQA 4/2, 2 layers.
_WIDE_HEADS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                   initializer_range=0.1, eos_token_id=2, bos_token_id=None, pad_token_id=0)


def _configs(vocab: int) -> dict:
    return {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
                  dict(_WIDE_HEADS, vocab_size=vocab, rope_theta=1e6, tie_word_embeddings=True)),
        "llama": ("LlamaConfig", "LlamaForCausalLM",
                  dict(_WIDE_HEADS, vocab_size=vocab, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 5e5})),
    }


@pytest.fixture(scope="module", params=("qwen3", "llama"))
def family_file(request, tmp_path_factory):
    hf_dir = save_random_checkpoint(str(tmp_path_factory.mktemp(request.param)), request.param, _configs)
    return hf_dir, write_tiny_gguf(hf_dir, str(Path(hf_dir) / "model.gguf"))


def _chunks(vocab: int, count: int = 2, length: int = 40) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(3).integers(3, vocab, (count, length)))


def test_reference_is_transformers_float64_model(family_file):
    import transformers

    hf_dir, path = family_file
    model = reference.GGUFTensors(path)
    chunks = _chunks(300)  # (the tiny tokenizer has 400)
    ref, layers = reference.reference_logits(model, chunks, first=0)  # [C, T - 1, V]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64).eval()
    with torch.inference_mode():
        out = theirs(chunks, output_hidden_states=True)
    expected = out.logits[:, :-1].log_softmax(-1)
    # transformers takes its rope angles in float32 (1e-6 here); a wrong rope pairing, norm or
    # head layout is off by O(1)
    assert (ref - expected).abs().max().item() < 1e-5
    # transformers' last hidden state is after the final norm; the layers before it are raw
    for mine, hf in zip(layers[:-1], out.hidden_states[1:-1]):
        assert (mine - hf).abs().max().item() < 1e-5


def test_cadence_native_path_matches_the_reference_layer_by_layer(family_file):
    _, path = family_file
    loaded = load_model(path, dtype="float32", device="cpu", quantization="gguf")
    chunks = _chunks(loaded.config.vocab_size)
    first = 20
    ref, ref_layers = reference.reference_logits(reference.GGUFTensors(path), chunks, first)
    # prompt steps of 40 rows: the per-op path, whose layers the hook sees
    ours, our_layers = reference.cadence_logits(loaded, chunks, first, prefill_chunk=40)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4
    for mine, exact in zip(our_layers, ref_layers):
        assert ((mine - exact).norm() / exact.norm()).item() < 1e-5
    kl = (ref.exp() * (ref - ours)).sum(-1)
    assert kl.max().item() < 1e-8


@pytest.mark.parametrize("adds_bos", (False, True))
def test_chunks_put_bos_first_only_where_the_vocabulary_adds_it(family_file, adds_bos):
    _, path = family_file
    reader = GGUFFile(path)
    reader.fields["tokenizer.ggml.bos_token_id"] = 1
    reader.fields["tokenizer.ggml.add_bos_token"] = adds_bos
    tokenizer = tokenizer_from_gguf(reader)
    assert (tokenizer.encode("hello", add_special_tokens=True)[0] == 1) == adds_bos
    bos = perplexity.chunk_bos(tokenizer)
    assert bos == (1 if adds_bos else None)
    ids = list(range(10, 30))
    second = perplexity.chunk_tokens(ids, 8, 1, bos)
    assert second == ([1] if adds_bos else [18]) + list(range(19, 26))
