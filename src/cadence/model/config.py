"""ModelConfig: the shape of a decoder-only model, independent of where the weights come from.

One configurable decoder serves every family: a family is a set of per-layer pieces (norm
placement, q/k norms, activation, rope variant, attention window, soft-capping) named by the
fields below. The loaders (hf_loader, gguf_loader) translate a checkpoint's own metadata into
these fields; the model (llama.py) only reads the fields, never the family name, except to
report it. Adding a family = a loader mapping plus, where it brings a new piece, one new field.
"""

from __future__ import annotations

from dataclasses import dataclass

# Families the configurable decoder serves (Hugging Face model_type spelling).
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3",
                           "qwen3_moe", "mixtral")

# Rope variants (HF `rope_type`): how inverse frequencies and the cos/sin amplitude are derived.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

# Per-layer attention kinds (HF `layer_types` spelling).
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

# MLP activations: SwiGLU (silu) or GeGLU with the tanh approximation (Gemma).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """Rope scaling parameters as they appear in HF configs (rope_scaling / rope_parameters) and
    in GGUF metadata; unused fields keep their defaults for a given rope_type."""

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # yarn / longrope: multiplier of cos and sin (None = derived from factor as HF does)
    attention_factor: float | None = None
    # longrope: per-frequency divisors below / above original_max_position_embeddings
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope scaling {self.rope_type!r} is not supported; supported: {ROPE_TYPES}")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only causal LM (names follow Hugging Face's config.json)."""

    architecture: str  # one of SUPPORTED_ARCHITECTURES (reporting and loader dispatch only)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # --- per-family pieces (defaults = Llama) ---
    rope_scaling: RopeScaling | None = None
    # Fraction of head_dim that is rotated (Phi-4-mini 0.75); the rest passes through.
    partial_rotary_factor: float = 1.0
    # Per-layer rope on/off (SmolLM3: every 4th layer has none); None = rope on every layer.
    rope_layers: tuple[bool, ...] | None = None
    # Rope base of sliding-window layers when it differs from rope_theta (Gemma 3: 10000), and
    # those layers then use no rope scaling.
    rope_local_theta: float | None = None
    # RMS norm on each head's q and k before rope (Qwen3, Gemma 3).
    qk_norm: bool = False
    # Norms around attention and MLP outputs too (Gemma 2/3: post_attention_layernorm on the
    # attention output, pre_feedforward_layernorm before and post_feedforward_layernorm after
    # the MLP). Norm weights are stored as HF's Llama convention (y = w * x_hat): Gemma's
    # (1 + w) is folded in by the loader.
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    # Embeddings multiplied by this (Gemma: sqrt(hidden_size), rounded to the compute dtype).
    embedding_multiplier: float | None = None
    # Attention scale = query_pre_attn_scalar ** -0.5 (Gemma), else head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    # Gemma 2: tanh soft-capping of attention scores and final logits (None = off).
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # Sliding-window attention: a query at position p sees keys at positions > p - sliding_window
    # (HF semantics), on the layers whose layer_types entry is SLIDING_ATTENTION.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None  # None = every layer FULL_ATTENTION
    mlp_bias: bool = False
    # Mixture of experts (Qwen3-MoE, Mixtral): an MoE layer's MLP is a router [num_experts, H]
    # and num_experts SwiGLU experts of width moe_intermediate_size; each token runs the
    # num_experts_per_tok experts of highest softmax(router logits), their outputs weighted by
    # those probabilities (renormalised to sum 1 with norm_topk_prob). 0 experts = dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None  # None = intermediate_size
    norm_topk_prob: bool = True
    # Which layers are MoE (Qwen3-MoE's mlp_only_layers / decoder_sparse_step leave some dense,
    # of width intermediate_size); None = every layer, when num_experts > 0.
    moe_layers: tuple[bool, ...] | None = None
    # The routing weights rounded to the compute dtype before they scale the experts' outputs
    # (HF Qwen3-MoE); Mixtral multiplies by the float32 weights.
    moe_round_routing_weights: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {SUPPORTED_ARCHITECTURES}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {self.hidden_act!r} is not supported; supported: {ACTIVATIONS}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.num_experts < 0 or (self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError(f"num_experts_per_tok must be in [1, num_experts], got {self.num_experts_per_tok} "
                             f"of {self.num_experts}")
        if self.moe_intermediate_size is not None and self.moe_intermediate_size <= 0:
            raise ValueError(f"moe_intermediate_size must be positive, got {self.moe_intermediate_size}")
        for name in ("rope_layers", "layer_types", "moe_layers"):
            value = getattr(self, name)
            if value is not None and len(value) != self.num_layers:
                raise ValueError(f"{name} has {len(value)} entries for {self.num_layers} layers")
        if self.layer_types is not None:
            unknown = set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION}
            if unknown:
                raise ValueError(f"unknown layer types {sorted(unknown)}")
            if SLIDING_ATTENTION in self.layer_types and not self.sliding_window:
                raise ValueError("sliding-attention layers need a positive sliding_window")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")

    @property
    def q_size(self) -> int:
        """Width of the query projection output (num_heads * head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each key/value projection output (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that rope rotates (even)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    def layer_window(self, layer: int) -> int | None:
        """The attention window of a layer (None = full attention)."""
        if self.layer_types is None or self.layer_types[layer] != SLIDING_ATTENTION:
            return None
        return self.sliding_window

    def layer_has_rope(self, layer: int) -> bool:
        return self.rope_layers is None or self.rope_layers[layer]

    def layer_is_moe(self, layer: int) -> bool:
        """Whether a layer's MLP is the mixture of experts (else the dense SwiGLU)."""
        return self.num_experts > 0 and (self.moe_layers is None or self.moe_layers[layer])

    @property
    def expert_intermediate_size(self) -> int:
        """Width of one expert's gate / up projections."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def mlp_width_per_token(self) -> int:
        """The widest gate/up activation a token has in any layer: the dense width, or the
        routed experts' widths together (activation memory bounds)."""
        if self.num_experts == 0:
            return self.intermediate_size
        return max(self.intermediate_size, self.num_experts_per_tok * self.expert_intermediate_size)

    @property
    def is_plain_llama(self) -> bool:
        """Whether every layer is the plain Llama shape: SwiGLU, pre-norms only, no q/k norms,
        full rope, default attention scale, no window, no capping, and dense."""
        return not self.qk_norm and self._llama_but_qk_norm

    def stack_computes(self) -> bool:
        """Whether the fused CPU decode stacks (bf16, float32) compute every layer: the plain Llama
        shape, also with per-head q/k norms (Qwen3), which every stack has. Other families (and
        mixture-of-experts layers) run the per-op path, whose pieces read every family field."""
        return self._llama_but_qk_norm

    @property
    def _llama_but_qk_norm(self) -> bool:
        return (not self.sandwich_norms and self.hidden_act == "silu"
                and self.embedding_multiplier is None and self.query_pre_attn_scalar is None
                and self.attn_logit_softcapping is None and self.final_logit_softcapping is None
                and self.layer_types is None and self.rope_layers is None
                and self.partial_rotary_factor == 1.0 and self.rope_local_theta is None
                and not self.mlp_bias and self.num_experts == 0)
