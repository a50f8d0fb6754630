"""Mixture-of-experts models (Qwen3-MoE, Mixtral) beyond the family-wide tests
(test_families_vs_hf.py, test_gguf_families.py run both against transformers): a step runs
only the experts its tokens chose, the routing settings change the logits, GGUF files with
quantized and fused expert tensors load and compute (float, widened int8 and the file's own
blocks, K-quants included), the engine's greedy tokens do not depend on batching or chunking,
and the startup line says the fused decode stack is not used."""

from __future__ import annotations

import dataclasses
import os

import gguf
import numpy as np
import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fast_path_info import describe_fast_path
from cadence.model.gguf_modules import GGUFLinear
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from cadence.model.moe import SparseMoeBlock

from .family_checkpoints import build_family_checkpoint
from .gguf_family_checkpoints import build_gguf_family_checkpoint
from .gguf_helpers import write_tiny_gguf
from .paged_helpers import paged_logits
from .random_gguf import random_matrix
from .test_families_vs_hf import PROMPTS, engine_tokens, hf_logits, random_prompt

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory) -> str:
    return build_family_checkpoint(str(tmp_path_factory.mktemp("qwen3_moe")), "qwen3_moe")


@pytest.fixture(scope="module")
def gguf_moe_dir(tmp_path_factory) -> str:
    """The GGUF-compatible Qwen3-MoE checkpoint (every layer routed, top-k renormalised)."""
    return build_gguf_family_checkpoint(str(tmp_path_factory.mktemp("qwen3_moe_gguf")), "qwen3_moe")


def _count_expert_calls(model, monkeypatch) -> list[int]:
    """Every expert's forward / forward_cpu appends its (layer, expert) row count to the list."""
    calls: list[int] = []
    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoeBlock):
            for expert in layer.mlp.experts:
                for method in ("forward", "forward_cpu"):
                    real = getattr(expert, method)
                    monkeypatch.setattr(expert, method,
                                        lambda x, *a, _real=real: calls.append(x.shape[0]) or _real(x, *a))
    return calls


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "torch"])
def test_a_step_runs_only_the_chosen_experts_once_each(qwen3_moe_dir, monkeypatch, use_kernels):
    loaded = load_model(qwen3_moe_dir, dtype="float32", device="cpu")
    config = loaded.config
    moe_layers = sum(config.layer_is_moe(i) for i in range(config.num_layers))
    assert moe_layers == 2 and config.moe_layers == (True, False, True)  # mlp_only_layers=[1]
    calls = _count_expert_calls(loaded.model, monkeypatch)
    kv = KVCache(config, 16, 4, loaded.dtype, loaded.device)
    prompt = random_prompt(config.vocab_size, 9, seed=3)
    with torch.inference_mode():
        meta = AttentionMetadata.build([(0, 8, list(range(3)))], 4, 16)
        loaded.model(torch.tensor(prompt[:8]), meta.positions, meta, kv, use_kernels=use_kernels)
        # A prompt chunk: each expert at most once per layer, every token's k choices covered.
        assert len(calls) <= moe_layers * config.num_experts
        assert sum(calls) == moe_layers * 8 * config.num_experts_per_tok
        calls.clear()
        meta = AttentionMetadata.build([(8, 1, list(range(3)))], 4, 16)
        loaded.model(torch.tensor(prompt[8:]), meta.positions, meta, kv, use_kernels=use_kernels)
    # A decode step: its top-k experts only, one row each.
    assert calls == [1] * (moe_layers * config.num_experts_per_tok)


def test_routing_settings_change_the_logits(qwen3_moe_dir):
    """The tiny checkpoint exercises the routing knobs: renormalised top-k weights or one
    more routed expert give other logits in transformers (so matching it checks them)."""
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, dtype=torch.float32).eval()
    prompt = random_prompt(base.config.vocab_size, 20, seed=2)
    expected = hf_logits(base, prompt)
    for change in ({"norm_topk_prob": True}, {"num_experts_per_tok": 3}):
        config = transformers.AutoConfig.from_pretrained(qwen3_moe_dir, **change)
        other = transformers.AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, config=config,
                                                                  dtype=torch.float32).eval()
        assert (hf_logits(other, prompt) - expected).abs().max().item() > 1e-2, change


def test_fast_path_line_says_moe_takes_the_per_op_path(qwen3_moe_dir):
    loaded = load_model(qwen3_moe_dir, dtype="float32", device="cpu")
    line, _ = describe_fast_path(loaded)
    assert "mixture of experts (4 experts, top 2): per-op path, no fused decode stack" in line
    kernels = load_cpu_kernels()
    if kernels is not None:
        assert loaded.model._stack_for(kernels) is False


def test_fused_gate_up_experts_load_as_the_separate_ones(gguf_moe_dir, tmp_path):
    """ffn_gate_up_exps (the converter's optional gate/up fusion) gives the unfused file's logits,
    on the float path and on the file's own blocks."""
    plain = write_tiny_gguf(gguf_moe_dir, str(tmp_path / "plain.gguf"))
    fused = write_tiny_gguf(gguf_moe_dir, str(tmp_path / "fused.gguf"), fuse_gate_up_exps=True)
    names = {t.name for t in gguf.GGUFReader(fused).tensors}
    assert "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_gate_exps.weight" not in names
    prompt = random_prompt(400, 21, seed=4)
    for quantization in ("none", "gguf"):
        a = paged_logits(load_model(plain, dtype="float32", device="cpu", quantization=quantization), prompt, 8)
        b = paged_logits(load_model(fused, dtype="float32", device="cpu", quantization=quantization), prompt, 8)
        assert torch.equal(a, b), quantization


def _rows_close(got: torch.Tensor, ref: torch.Tensor, bound: float = 0.05, share: float = 0.9) -> bool:
    """Whether at least `share` of the positions' logits are within `bound` (relative to the
    largest reference logit): quantized weights and 8-bit activations may flip a near-tie of
    the router's top-k at some position (llama.cpp's quantized runs too), which moves that
    position's logits by much more than the quantization error itself."""
    rows = (got - ref).abs().amax(-1) / ref.abs().max()
    return (rows < bound).float().mean().item() >= share


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=lambda t: t.name)
def test_quantized_experts_on_every_path(gguf_moe_dir, tmp_path, qtype):
    """A file whose layers (3-D expert tensors included; the router stays F32) are Q8_0 / Q4_1:
    `auto` computes it widened to int8 / int4 with each expert packed, `gguf` on the file's own
    blocks; both close to the file's float32 values, with the engine's greedy tokens the same
    whatever the batching and chunking."""
    path = write_tiny_gguf(gguf_moe_dir, str(tmp_path / f"{qtype.name}.gguf"), layer_type=qtype)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == qtype and types["blk.0.ffn_gate_inp.weight"] == Q.F32
    reference = load_model(path, dtype="float32", device="cpu", quantization="none")
    prompt = random_prompt(reference.config.vocab_size, 24, seed=6)
    ref = paged_logits(reference, prompt, 24)
    widened = load_model(path, device="cpu")  # auto: the file's 8 / 4 bits
    expected_format = "int8" if qtype == Q.Q8_0 else "int4"
    kernels = load_cpu_kernels()
    if kernels is not None and widened.model.decode_weight_format == expected_format:
        widened.model.prepare_fast_path()
        expert = widened.model.model.layers[0].mlp.experts[0]
        assert expert.packed is not None and expert.quantize_inputs
    native = load_model(path, device="cpu", quantization="gguf")
    assert isinstance(native.model.model.layers[0].mlp.experts[3].down_proj, GGUFLinear)
    for loaded in (widened, native):
        assert _rows_close(paged_logits(loaded, prompt, 5), ref)
    tokens = engine_tokens(native, PROMPTS, "eager", 8192, 1, prefix=False)
    assert engine_tokens(native, PROMPTS, "chunked", 5, 64, prefix=False) == tokens


def _kquant_moe_dir(out_dir: str) -> str:
    """A Qwen3-MoE checkpoint whose GEMM inputs are a K-quant block's 256 weights wide (hidden
    and expert width 256)."""
    from .family_checkpoints import save_random_checkpoint

    def configs(vocab: int) -> dict:
        return {"qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
            vocab_size=vocab, hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.1,
            eos_token_id=2, bos_token_id=None, pad_token_id=0, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=256, norm_topk_prob=True, tie_word_embeddings=False))}

    return save_random_checkpoint(out_dir, "qwen3_moe", configs)


def test_k_quant_experts_on_their_own_blocks(tmp_path):
    """Q4_K gate/up and Q6_K down expert tensors (a Q4_K_M file's types; random valid blocks:
    gguf-py cannot quantize K-quants) computed per expert on their repacked blocks: close to
    the same file decoded to float32."""
    os.makedirs(tmp_path / "hf")
    hf_dir = _kquant_moe_dir(str(tmp_path / "hf"))
    rng = np.random.default_rng(0)
    raw = {}
    for layer in range(2):
        for name, qtype in (("ffn_gate_exps", Q.Q4_K), ("ffn_up_exps", Q.Q4_K), ("ffn_down_exps", Q.Q6_K)):
            # [E, N, row bytes]: 4 experts of 256 x 256
            raw[f"blk.{layer}.{name}.weight"] = (np.stack([random_matrix(rng, qtype, 256, 256) for _ in range(4)]),
                                                 qtype)
    path = write_tiny_gguf(hf_dir, str(tmp_path / "q4_k.gguf"), raw_tensors=raw)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == Q.Q4_K and types["blk.1.ffn_down_exps.weight"] == Q.Q6_K
    native = load_model(path, device="cpu")  # auto: K-quants compute on their own blocks
    assert native.model.native_gguf
    expert = native.model.model.layers[1].mlp.experts[2]
    assert expert.gate_proj.gguf_weight.ggml_type == Q.Q4_K and expert.down_proj.gguf_weight.ggml_type == Q.Q6_K
    reference = load_model(path, dtype="float32", device="cpu", quantization="none")
    prompt = random_prompt(reference.config.vocab_size, 20, seed=8)
    assert _rows_close(paged_logits(native, prompt, 6), paged_logits(reference, prompt, 20))


def test_memory_bound_counts_every_experts_weights(gguf_moe_dir, tmp_path):
    """The engine's memory bound holds all experts (every one is resident, whichever run), on
    the float path and as GGUF blocks; the activation term widens to a token's top-k experts."""
    from cadence.engine.memory_bound import activation_bytes, model_bytes

    path = write_tiny_gguf(gguf_moe_dir, str(tmp_path / "f32.gguf"))
    floats = load_model(path, dtype="float32", device="cpu", quantization="none")
    config = floats.config
    expert_params = 3 * config.hidden_size * config.expert_intermediate_size
    experts = config.num_layers * config.num_experts * expert_params * 4  # float32 bytes
    assert model_bytes(floats.model) >= experts
    native = load_model(path, device="cpu", quantization="gguf")
    assert model_bytes(native.model) >= experts  # F32 blocks: the same bytes
    wide = dataclasses.replace(config, num_experts_per_tok=4, moe_intermediate_size=64)
    assert wide.mlp_width_per_token == 256
    assert activation_bytes(wide, 8, 1) - activation_bytes(config, 8, 1) == 8 * 3 * (256 - 128) * 4
