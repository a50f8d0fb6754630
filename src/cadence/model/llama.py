"""LlamaForCausalLM over a paged KV cache: Llama, Mistral (same shape) and Qwen2 (q/k/v bias).

Parameter names match Hugging Face's (`model.layers.0.self_attn.q_proj.weight` ...) so an HF
safetensors state dict loads as is. The forward takes a flat batch of new tokens from any number
of sequences ([T] ids, [T] positions) and AttentionMetadata saying which sequence each belongs to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.model.attention import paged_attention
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.config import ModelConfig
from cadence.model.kv_cache import KVCache
from cadence.model.rope import apply_rope, rope_cos_sin


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32, cast back before the weight (as HF Llama does)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv: KVCache) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        attn = paged_attention(q, k, v, kv.k[self.layer_idx], kv.v[self.layer_idx], meta, self.scale)
        return self.o_proj(attn.reshape(num_tokens, -1))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv: KVCache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder plus LM head; `forward` returns hidden states, `compute_logits` the logits."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config says so (call after load)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: KVCache) -> torch.Tensor:
        """input_ids, positions: [T] -> final-norm hidden states [T, hidden_size]."""
        x = self.model.embed_tokens(input_ids)  # [T, H]
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, meta, kv)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden_size] (only the rows to sample) -> logits [S, vocab_size] float32."""
        return self.lm_head(hidden).float()
