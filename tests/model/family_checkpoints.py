"""Tiny random checkpoints of every model family, saved by transformers with its real config
classes (so config.json is what the library writes today), plus the tiny tokenizer.

Each family is set up so its pieces show in the logits: sliding windows of 8 (prompts are
longer), soft-caps low enough to bite on random weights, mixed sliding/full and rope/no-rope
layers, rope scalings whose ranges cover the head's frequencies, and random norm weights and
biases (tests/conftest._randomize).
"""

from __future__ import annotations

import os

from tests.conftest import _randomize, build_tiny_tokenizer

WINDOW = 8
# head_dim 16 (4 heads on 2 KV heads) by default; the plain-Llama variants use head_dim 64 so
# the fused decode stack (head_dim 64 / 128 only) runs their rope scaling too.
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
D64 = dict(hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)


def _family_configs(vocab: int) -> dict:
    """name -> (config class name, model class name, config kwargs)."""
    common = dict(vocab_size=vocab, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                  initializer_range=0.1, eos_token_id=2, bos_token_id=None, pad_token_id=0)
    llama = dict(common, **D64, tie_word_embeddings=False)

    def llama_rope(params: dict) -> tuple:
        return "LlamaConfig", "LlamaForCausalLM", dict(llama, rope_parameters={"rope_theta": 10000.0, **params})

    half = 6  # Phi-3's rotated dims / 2: head_dim 16 * 0.75 = 12
    return {
        "llama3": llama_rope({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "llama_linear": llama_rope({"rope_type": "linear", "factor": 4.0}),
        "llama_dynamic": llama_rope({"rope_type": "dynamic", "factor": 2.0}),
        "llama_yarn": llama_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
                  dict(common, **SMALL, head_dim=16, num_hidden_layers=3, rope_theta=1e6, use_sliding_window=True,
                       sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=True)),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   dict(common, **SMALL, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                        attn_logit_softcapping=3.0, final_logit_softcapping=4.0)),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(common, **SMALL, head_dim=16, num_hidden_layers=3, query_pre_attn_scalar=16,
                        sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
        "phi3": ("Phi3Config", "Phi3ForCausalLM",
                 dict(common, **SMALL, max_position_embeddings=256, original_max_position_embeddings=64,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                       "short_factor": [1.0 + 0.3 * i for i in range(half)],
                                       "long_factor": [2.0 + 0.5 * i for i in range(half)]})),
        "mistral_window": ("MistralConfig", "MistralForCausalLM",
                           dict(common, **SMALL, sliding_window=WINDOW, tie_word_embeddings=False)),
        "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                    dict(common, **SMALL, no_rope_layers=[1, 0], rope_parameters={"rope_theta": 2e6})),
        # 4 experts, top-2, un-normalised top-k weights (the config class's default), layer 1
        # dense (mlp_only_layers) of another width than the experts'.
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(common, **SMALL, head_dim=16, num_hidden_layers=3, rope_theta=1e6, num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                           mlp_only_layers=[1], tie_word_embeddings=False)),
        # 4 experts, top-2 (renormalised), a window on every layer.
        "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                    dict(common, **SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                         tie_word_embeddings=False)),
    }


# The model-level tests' families: linear and dynamic rope differ from llama3's only in their
# frequencies, which tests/model/test_rope.py checks against transformers directly.
FAMILIES = tuple(name for name in _family_configs(400) if name not in ("llama_linear", "llama_dynamic"))


def build_family_checkpoint(out_dir: str, family: str) -> str:
    """A random transformers model of `family` (a FAMILIES name) and the tiny tokenizer in out_dir."""
    return save_random_checkpoint(out_dir, family, _family_configs)


def save_random_checkpoint(out_dir: str, family: str, family_configs) -> str:
    """The tiny tokenizer and a seeded random model of `family_configs(vocab)[family]` (config
    class, model class, kwargs) saved as safetensors in out_dir."""
    import torch
    import transformers

    vocab = build_tiny_tokenizer(out_dir)
    config_name, model_name, kwargs = family_configs(vocab)[family]
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    _randomize(model)
    if "gemma" in family:
        with torch.no_grad():  # Gemma norms store w of (1 + w): random around 0, not 1
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.sub_(1.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    assert os.path.isfile(os.path.join(out_dir, "config.json"))
    return out_dir
