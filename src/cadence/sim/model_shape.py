"""The sizes of a Llama-family model that decide its step cost (no weights, no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer with grouped-query attention and a SwiGLU MLP."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = True
    bytes_per_param: float = 2.0  # bf16
    bytes_per_kv_element: float = 2.0

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h  # q, k, v, o projections
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        return attention + mlp

    @property
    def layer_params(self) -> int:
        return self.num_layers * self.params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights a step streams: every layer, plus the LM head (the embedding table
        itself when tied; an embedding lookup touches only a few rows)."""
        return (self.layer_params + self.lm_head_params) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one position over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_kv_element

    @property
    def attention_flops_per_pair(self) -> float:
        """One (query, key) pair of causal attention over all layers: q.k and p.v per head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim


# The default model: SmolLM2-135M-Instruct (Llama arch), as run in bf16.
SMOLLM2_135M = ModelShape(
    name="SmolLM2-135M",
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
)
