"""Tiny random HF checkpoints of every family, set up as a GGUF file can carry them.

transformers' real config classes, tiny sizes (hidden 64, head_dim 16, 2-6 layers, the tiny
400-token tokenizer). Each family shows its pieces: windows of 8 (the prompts are longer),
soft-caps low enough to bite, rope scalings whose ranges cover the head's frequencies. Where
GGUF stores less than config.json, the checkpoint keeps to what llama.cpp derives, so the GGUF
round trip is exact:
- Gemma: query_pre_attn_scalar = head_dim (llama.cpp's rule outside the 27B models);
- Gemma 3: the default layer_types (every 6th layer global: 6 layers);
- SmolLM3: the default no-rope interval of 4 (4 layers);
- Qwen3: no sliding window (llama.cpp's qwen3 has none);
- Qwen3-MoE: norm_topk_prob and every layer MoE (llama.cpp's qwen3moe always renormalises the
  top-k weights and has no dense layers); Mixtral: no window (the converter writes none).
"""

from __future__ import annotations

from tests.model.family_checkpoints import save_random_checkpoint

WINDOW = 8
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
_HALF_ROTARY = 6  # Phi-3: head_dim 16 * 0.75 rotated dims / 2


def _family_configs(vocab: int) -> dict[str, tuple[str, str, dict]]:
    """family -> (config class, model class, config kwargs)."""
    common = dict(vocab_size=vocab, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                  initializer_range=0.1, eos_token_id=2, bos_token_id=None, pad_token_id=0, **SMALL)

    def llama(rope: dict, **extra) -> tuple[str, str, dict]:
        return "LlamaConfig", "LlamaForCausalLM", dict(
            common, tie_word_embeddings=False, rope_parameters={"rope_theta": 10000.0, **rope}, **extra)

    return {
        "llama3": llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "llama_linear": llama({"rope_type": "linear", "factor": 4.0}),
        "llama_yarn": llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
                  dict(common, head_dim=16, num_hidden_layers=3, rope_theta=1e6, tie_word_embeddings=True)),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   dict(common, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                        attn_logit_softcapping=3.0, final_logit_softcapping=4.0)),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   dict(common, head_dim=16, num_hidden_layers=6, query_pre_attn_scalar=16,
                        sliding_window=WINDOW,
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
        "phi3": ("Phi3Config", "Phi3ForCausalLM",
                 dict(common, max_position_embeddings=256, original_max_position_embeddings=64,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.75,
                                       "short_factor": [1.0 + 0.3 * i for i in range(_HALF_ROTARY)],
                                       "long_factor": [2.0 + 0.5 * i for i in range(_HALF_ROTARY)]})),
        "mistral_window": ("MistralConfig", "MistralForCausalLM",
                           dict(common, sliding_window=WINDOW, tie_word_embeddings=False)),
        "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                    dict(common, num_hidden_layers=4, rope_parameters={"rope_theta": 2e6})),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(common, head_dim=16, rope_theta=1e6, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False)),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                    dict(common, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    }


GGUF_FAMILIES = tuple(_family_configs(400))


def build_gguf_family_checkpoint(out_dir: str, family: str) -> str:
    """A random transformers model of `family` (a GGUF_FAMILIES name) and the tiny tokenizer."""
    return save_random_checkpoint(out_dir, family, _family_configs)
