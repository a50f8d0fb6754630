"""Models computed from their GGUF blocks (`--quantization gguf`): no float copy, same numbers.

For each ggml type a random llama-architecture file is loaded natively and compared with the
same model written as float32 (the blocks' dequantized values) and loaded the float way: the
logits agree within the error of 8-bit activations, and greedy tokens within the paged,
chunked and batched runs of the native model are identical. Memory: after a forward has read
every matrix the process grew by about the file, never by its float32 expansion.
"""

from __future__ import annotations

import gc
import os

import gguf
import pytest
import torch

from cadence.model.gguf_modules import GGUFEmbedding, GGUFLinear, gguf_module_bytes
from cadence.model.loader import load_model
from .random_gguf import Q, write_random_gguf

NATIVE_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL,
                Q.IQ4_XS, Q.F16, Q.BF16, Q.F32]


def _logits(loaded, ids: list[int]) -> torch.Tensor:
    from cadence.model.attention_metadata import AttentionMetadata
    from cadence.model.kv_cache import KVCache

    block = 16
    blocks = -(-len(ids) // block) + 1
    kv = KVCache(loaded.config, blocks, block, loaded.dtype, "cpu")
    meta = AttentionMetadata.build([(0, len(ids), list(range(blocks)))], block, blocks)
    with torch.inference_mode():
        hidden = loaded.model(torch.tensor(ids), meta.positions, meta, kv)
        return loaded.model.compute_logits(hidden).float()


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda t: t.name)
def test_native_model_matches_its_dequantized_twin(tmp_path, qtype):
    native_path = write_random_gguf(str(tmp_path / "native.gguf"), qtype, float_twin=str(tmp_path / "twin.gguf"))
    native = load_model(native_path, dtype="float32", device="cpu", quantization="gguf")
    twin = load_model(str(tmp_path / "twin.gguf"), dtype="float32", device="cpu", quantization="none")
    layers = native.model.model.layers
    assert isinstance(native.model.model.embed_tokens, GGUFEmbedding)
    assert isinstance(layers[0].self_attn.q_proj, GGUFLinear) and isinstance(layers[1].mlp.down_proj, GGUFLinear)
    assert layers[0].self_attn.q_proj.gguf_weight.ggml_type == qtype
    ids = [(7 * i + 3) % 500 + 2 for i in range(40)]
    ours, ref = _logits(native, ids), _logits(twin, ids)
    # 8-bit activations on integer types (llama.cpp's arithmetic); float types compute in
    # float32 (bf16 dot products where the CPU has them).
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel < (0.06 if qtype not in (Q.F32, Q.F16) else 0.01), rel


def test_native_greedy_tokens_do_not_depend_on_chunking_or_batching(tmp_path):
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.llm import LLM

    path = write_random_gguf(str(tmp_path / "m.gguf"), Q.Q4_K)
    prompts = [[(5 * i + j) % 500 + 2 for j in range(37 + 11 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = [LLM(path, quantization="gguf", dtype="float32", max_num_batched_tokens=512, num_gpu_blocks_override=64)
             .generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    llm = LLM(path, quantization="gguf", dtype="float32", max_num_batched_tokens=16, num_gpu_blocks_override=64)
    together = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                              use_tqdm=False)]
    assert [list(t) for t in together] == [list(t) for t in alone]


def test_unsupported_type_is_a_clear_error(tmp_path):
    from cadence.model.errors import ModelLoadError

    path = write_random_gguf(str(tmp_path / "q.gguf"), Q.Q8_0)
    reader = gguf.GGUFReader(path)
    assert reader.tensors  # a valid file; now one whose type cadence does not compute
    from cadence.model.gguf_weight import check_supported

    with pytest.raises(ValueError, match="IQ2_XXS.*supported types: F32"):
        check_supported(Q.IQ2_XXS)
    with pytest.raises(ModelLoadError):
        load_model(str(tmp_path / "missing.gguf"), quantization="gguf")


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


# Every type issue 29 lists, and Gemma 3 270M's Q5_0.
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.F16, Q.BF16, Q.F32],
                         ids=lambda t: t.name)
def test_native_load_holds_the_file_not_a_float_copy(tmp_path, qtype):
    hidden, inter, layers, vocab = 1024, 2048, 2, 4096
    path = write_random_gguf(str(tmp_path / "big.gguf"), qtype, hidden=hidden, inter=inter, layers=layers,
                             heads=8, kv_heads=2, vocab=vocab)
    file_bytes = os.path.getsize(path)
    # Warm up first (kernel library, thread pools, allocator arenas): what is measured below
    # is then only what this model's load and forward add.
    small = write_random_gguf(str(tmp_path / "small.gguf"), qtype, hidden=256, inter=512, layers=1, vocab=512)
    warm = load_model(small, dtype="float32", device="cpu", quantization="gguf")
    _logits(warm, list(range(2, 34)))
    del warm
    float_bytes = 4 * (layers * (hidden * hidden * 2 + 2 * hidden * 256 + 3 * hidden * inter) + 2 * vocab * hidden)
    gc.collect()
    before = _rss()
    loaded = load_model(path, dtype="float32", device="cpu", quantization="gguf")
    _logits(loaded, list(range(2, 34)))  # reads every matrix
    grown = _rss() - before
    # Q4_K / Q6_K are repacked at load (columns interleaved, scales decoded): a few % more bytes.
    assert gguf_module_bytes(loaded.model) <= 1.1 * file_bytes
    # The file's pages (or their repacked copy), the q/k rows reordered (a copy of their
    # blocks), activations and the logits of 32 tokens: well under the float32 expansion.
    assert grown < 1.1 * file_bytes + 48 * 2**20, (grown, file_bytes)
    if qtype not in (Q.F16, Q.BF16, Q.F32):
        assert grown < float_bytes / 2.5, (grown, float_bytes)


def test_without_kernels_a_k_quant_file_is_dequantized_once_at_load(tmp_path, monkeypatch):
    """No compiled kernels (ARM, old x86, CADENCE_CPU_KERNELS=0): `--quantization auto` dequantizes a
    K-quant file's blocks once at load (slab-by-slab dequantization in every step decoded a
    270M model at 0.7 tok/s), keeping the blocks only past the memory budget; the logits are
    the float twin's."""
    from cadence.model import loader

    native_path = write_random_gguf(str(tmp_path / "native.gguf"), Q.Q4_K, float_twin=str(tmp_path / "twin.gguf"))
    import cadence.model.kernels.cpu_ops as cpu_ops

    monkeypatch.setattr(cpu_ops, "load_cpu_kernels", lambda: None)
    assert loader.file_weight_format(native_path, torch.device("cpu")) is None
    monkeypatch.setattr(loader, "host_available_bytes", lambda: 1024)
    assert loader.file_weight_format(native_path, torch.device("cpu")) == "gguf"  # past the budget
    monkeypatch.undo()
    monkeypatch.setattr(cpu_ops, "load_cpu_kernels", lambda: None)
    auto = load_model(native_path, dtype="float32", device="cpu")
    assert not isinstance(auto.model.model.layers[0].self_attn.q_proj, GGUFLinear)
    twin = load_model(str(tmp_path / "twin.gguf"), dtype="float32", device="cpu", quantization="none")
    ids = [3, 17, 99, 4, 250, 8]
    assert torch.allclose(_logits(auto, ids), _logits(twin, ids), atol=1e-4, rtol=1e-4)
