"""config_from_hf: each family's config.json spellings (transformers 5's rope_parameters and the
older flat fields) become the same ModelConfig; unsupported ones are named errors."""

from __future__ import annotations

import pytest

from cadence.model.config import FULL_ATTENTION as FULL, SLIDING_ATTENTION as SLIDING
from cadence.model.errors import ModelLoadError
from cadence.model.hf_loader import config_from_hf

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def cfg(arch: str, **fields) -> dict:
    return {"architectures": [arch], **BASE, **fields}


def test_rope_scaling_old_and_new_spellings_agree():
    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    new = config_from_hf(cfg("LlamaForCausalLM", rope_parameters={"rope_theta": 5e5, **params}), "x")
    old = config_from_hf(cfg("LlamaForCausalLM", rope_theta=5e5, rope_scaling=params), "x")
    assert new == old
    assert new.rope_theta == 5e5 and new.rope_scaling.rope_type == "llama3"
    assert new.rope_scaling.original_max_position_embeddings == 8192
    legacy = config_from_hf(cfg("LlamaForCausalLM", rope_scaling={"type": "linear", "factor": 2.0}), "x")
    assert legacy.rope_scaling.rope_type == "linear" and legacy.rope_scaling.factor == 2.0
    assert new.is_plain_llama  # rope scaling alone keeps the fused stack


def test_unsupported_rope_type_and_architecture_are_named():
    with pytest.raises(ModelLoadError, match="'mrope'.*supported: default, linear, dynamic, llama3, yarn, longrope"):
        config_from_hf(cfg("LlamaForCausalLM", rope_scaling={"rope_type": "mrope", "factor": 2.0}), "x")
    with pytest.raises(ModelLoadError, match="'GPT2LMHeadModel' is not supported.*Gemma2ForCausalLM.*SmolLM3ForCausalLM"):
        config_from_hf(cfg("GPT2LMHeadModel"), "x")
    with pytest.raises(ModelLoadError, match="model_type 'falcon' is not supported"):
        config_from_hf({**BASE, "model_type": "falcon"}, "x")
    with pytest.raises(ModelLoadError, match="'Gemma3ForConditionalGeneration' is not supported"):
        config_from_hf(cfg("Gemma3ForConditionalGeneration"), "x")


def test_sliding_windows_per_family():
    # Mistral: a window covers every layer; null means none.
    mistral = config_from_hf(cfg("MistralForCausalLM", sliding_window=1024), "x")
    assert mistral.layer_types == (SLIDING,) * 4 and mistral.sliding_window == 1024
    assert config_from_hf(cfg("MistralForCausalLM", sliding_window=None), "x").layer_types is None
    # A window no shorter than the model's context never excludes a key: dropped.
    assert config_from_hf(cfg("Phi3ForCausalLM", sliding_window=262144), "x").sliding_window is None
    # Qwen2/3: only with use_sliding_window, from max_window_layers on.
    assert config_from_hf(cfg("Qwen2ForCausalLM", sliding_window=1024), "x").layer_types is None
    qwen = config_from_hf(cfg("Qwen3ForCausalLM", sliding_window=1024, use_sliding_window=True,
                              max_window_layers=2), "x")
    assert qwen.layer_types == (FULL, FULL, SLIDING, SLIDING) and qwen.qk_norm
    # Gemma 2 alternates (sliding first); Gemma 3 by its pattern.
    gemma2 = config_from_hf(cfg("Gemma2ForCausalLM", sliding_window=512), "x")
    assert gemma2.layer_types == (SLIDING, FULL, SLIDING, FULL)
    gemma3 = config_from_hf(cfg("Gemma3ForCausalLM", sliding_window=512, sliding_window_pattern=2), "x")
    assert gemma3.layer_types == (SLIDING, FULL, SLIDING, FULL)


def test_gemma_pieces_and_defaults():
    gemma2 = config_from_hf(cfg("Gemma2ForCausalLM", head_dim=16, query_pre_attn_scalar=24), "x")
    assert gemma2.sandwich_norms and not gemma2.qk_norm and gemma2.hidden_act == "gelu_pytorch_tanh"
    assert gemma2.embedding_multiplier == 8.0 and gemma2.query_pre_attn_scalar == 24
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)  # class defaults
    assert gemma2.tie_word_embeddings
    # Gemma 3, old spelling: rope_theta + rope_local_base_freq + rope_scaling (global layers).
    old = config_from_hf(cfg("Gemma3ForCausalLM", rope_theta=1e6, rope_local_base_freq=1e4,
                             rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=512), "x")
    new = config_from_hf(cfg("Gemma3ForCausalLM", sliding_window=512, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "x")
    assert old == new
    assert new.qk_norm and new.rope_local_theta == 1e4 and new.rope_scaling.factor == 8.0
    assert new.attn_logit_softcapping is None
    with pytest.raises(ModelLoadError, match="bidirectional"):
        config_from_hf(cfg("Gemma3ForCausalLM", use_bidirectional_attention=True), "x")


def test_phi3_and_smollm3_pieces():
    phi = config_from_hf(cfg("Phi3ForCausalLM", max_position_embeddings=131072, original_max_position_embeddings=4096,
                             partial_rotary_factor=0.75,
                             rope_scaling={"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6}),
                         "x")
    assert phi.rotary_dim == 12 and phi.rope_scaling.rope_type == "longrope"
    assert phi.rope_scaling.original_max_position_embeddings == 4096 and phi.rope_scaling.factor == 32.0
    # SmolLM3: no_rope_layers[i] == 1 means layer i uses rope; by default every 4th has none.
    smol = config_from_hf(cfg("SmolLM3ForCausalLM"), "x")
    assert smol.rope_layers == (True, True, True, False)
    explicit = config_from_hf(cfg("SmolLM3ForCausalLM", no_rope_layers=[0, 1, 1, 1]), "x")
    assert explicit.rope_layers == (False, True, True, True) and not explicit.is_plain_llama
