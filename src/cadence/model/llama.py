"""LlamaForCausalLM over a paged KV cache: the one configurable decoder of every family.

The plain Llama layer (Llama, Mistral without a window, Qwen2 with its q/k/v bias) plus the
per-family pieces ModelConfig names (see its docstring and docs/ARCHITECTURE.md "Model
families"): rope variants and per-layer rope (model/rope.py), q/k RMS norms, sandwich norms,
GeGLU, an embedding multiplier, a query_pre_attn_scalar attention scale, attention and final
logit soft-capping, sliding-window layers, MLP biases. The layers read config fields, never
the family name.

Parameter names match Hugging Face's (`model.layers.0.self_attn.q_proj.weight` ...) so an HF
safetensors state dict loads as is. The forward takes a flat batch of new tokens from any number
of sequences ([T] ids, [T] positions) and AttentionMetadata saying which sequence each belongs to.

Fast path: after weights load, q/k/v and gate/up are fused into one matrix each (the separate
projections' parameters become views of it, so state dicts keep HF names and no memory is
doubled). On CPU with the compiled kernels (cadence.model.kernels) a layer is a handful of calls:
add + RMS norm, qkv GEMM, rope + cache write, gather-free paged attention, o GEMM, add + RMS norm,
gate/up GEMM, silu * up, down GEMM; small-batch bf16 GEMMs use an AVX512-BF16 kernel. Elsewhere
(CUDA, float16, kernels off with CADENCE_CPU_KERNELS=0) the same fused weights run through plain
torch ops, which are also the reference the fast path is tested against.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from cadence.model.attention import cached_attention, paged_attention, write_kv
from cadence.model.attention_cpu import paged_attention_cpu, rows_share_decode_kernel
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.config import ModelConfig
from cadence.model.fused_decode import (INTEGER_FORMATS, WEIGHT_FORMATS, build_decode_stack, has_f32_stack,
                                        lm_head_format, resolve_weight_format, round_weights_to_format,
                                        step_fits_stack, takes_stack)
from cadence.model.gguf_modules import GGUFLinear, linear_side_by_side
from cadence.model.gguf_stack import build_gguf_decode_stack
from cadence.model.kernels.cpu_ops import cpu_kernels_for
from cadence.model.kv_cache import KVCache
from cadence.model.moe import SparseMoeBlock, layer_mlps
from cadence.model.pause_points import PausePoints
from cadence.model.rope import RotaryEmbedding, apply_rope

# bf16 GEMMs with at most this many rows use the AVX512-BF16 kernel (memory-bound decode); larger
# ones (prefill, big batches) use torch's GEMM, which wins once the weights are reused enough.
SMALL_GEMM_MAX_ROWS = 8
# The per-op path of an int8 or int4 model runs its GEMMs on the fused stack's packed weights
# with integer dot products (linear_packed_f32), as the stack does, instead of torch's float32
# GEMM on the dequantized weights. torch's GEMM costs a near-fixed ~100 ms per step at small M
# on 2 Zen 3 cores (a 16-token chunk 175-180 ms vs 81-83 ms; 64 tokens 360-400 vs 290), which
# made chunks between the stack's 32 tokens and ~256 slow per token. Past 256 rows torch's GEMM
# was once about even (Zen 3, an earlier kernel: 512 tokens 2110 ms vs 2220-2320), so this was
# 256; the packed kernels now win at every size measured (Zen 4, 2 threads, prompt of 512 /
# 2048 tokens: int4 with VNNI 1459 / 928 tok/s vs 725 / 600 through torch; int8 1275 / 841 vs
# 751 / 621; the AVX2 tier forced, int8: 902 / 648 vs 674 / 602), and with one path a token's
# numbers no longer depend on how many rows its step had. CADENCE_PACKED_GEMM_MAX_ROWS=256
# restores the old split (A/B runs).
PACKED_GEMM_MAX_ROWS = int(os.environ.get("CADENCE_PACKED_GEMM_MAX_ROWS", "0")) or None

# A callback the layer-by-layer forward makes between two layers (and mid-layer): the engine
# runs an interjected short prompt there (cadence.engine.llm_engine). A PausePoints one may
# also be called between row blocks of a layer's ops (model/pause_points.py).
BetweenLayers = Callable[[], None]


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 kernels: ModuleType | None, quantize_input: bool = False) -> torch.Tensor:
    """x: [T, K] @ weight.T ([N, K]) + bias -> [T, N], through the small-GEMM kernel when it wins.

    quantize_input (int8 weights on the float32 fast path): x's rows quantized per group of 32
    as the int8 decode kernels quantize them, so that a prompt computed here and the same
    tokens computed by the fused stack multiply the same numbers (only summation order differs).
    """
    if quantize_input and kernels is not None and has_f32_stack(kernels):
        x = kernels.quantize_activations_q8(x.contiguous())
    if (kernels is not None and x.dtype == torch.bfloat16 and x.shape[0] <= SMALL_GEMM_MAX_ROWS
            and kernels.has_avx512bf16()):
        out = kernels.linear_bf16(x.contiguous(), weight)
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


_INTEGER_FORMAT_IDS = tuple(WEIGHT_FORMATS[f] for f in INTEGER_FORMATS)


@dataclass(frozen=True)
class PackedInteger:
    """A GEMM weight [N, K] packed for linear_packed_f32 in blocks of 16 columns: by the fused
    stack in an integer format (int8 or int4, scales per column and group of 32 k), or by
    LlamaForCausalLM._pack_per_op in any WEIGHT_FORMATS format (families without the stack)."""

    data: torch.Tensor  # int8: [N / 16, K, 16]; int4: [N / 16, K / 2, 16] uint8
    scales: torch.Tensor  # int8: [N / 16, K / 32, 16] float32; int4: [N / 16, K / 32, 2, 16] float16
    N: int
    format: int  # WEIGHT_FORMATS value
    # A float32 / bf16 copy used at every row count, not only up to PACKED_FLOAT_MAX_ROWS
    # (LlamaForCausalLM.pin_invariant_gemms: --deterministic).
    all_rows: bool = False

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, kernels: ModuleType) -> torch.Tensor:
        """x [T, K] float32 -> x_q8 @ W^T (+ bias) [T, N]: x quantized per row and group of 32 as
        the stack and quantize_activations_q8 quantize it, exact int32 sums per group."""
        return kernels.linear_packed_f32(x.contiguous(), self.data, self.scales, self.format, self.N, bias)


# Families that do not take the fused stack (not config.stack_computes) pack their per-op GEMM
# weights themselves on the float32 path (LlamaForCausalLM._pack_per_op): integer formats serve
# every row count as above; float32 / bf16 storage serves steps up to the stack's row bound
# (decode batches), where torch's float32 GEMM pays its near-fixed cost per call, and torch's
# GEMM keeps the prompt chunks.
PACKED_FLOAT_MAX_ROWS = 64


def _uses_packed(packed: tuple | None, x: torch.Tensor) -> bool:
    if packed is None:
        return False
    if packed[0].format not in _INTEGER_FORMAT_IDS:
        return packed[0].all_rows or x.shape[0] <= PACKED_FLOAT_MAX_ROWS
    return PACKED_GEMM_MAX_ROWS is None or x.shape[0] <= PACKED_GEMM_MAX_ROWS


def _gguf_blocks(linears: list[nn.Module]) -> bool:
    """Whether every one of these projections computes on its GGUF blocks (gguf_native), whose
    kernel gives a row the same bits whatever rows share the call."""
    return all(isinstance(lin, GGUFLinear) for lin in linears)


def _return_freed_memory() -> None:
    """Give freed heap memory back to the OS (glibc's malloc_trim; elsewhere nothing). The
    released layer weights were allocated below glibc's mmap threshold, on the heap, where a
    free keeps the pages in the process (its RSS did not move without this)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _fuse_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the linears' weights (and biases) row-wise into one matrix and re-point each
    linear's parameters at its slice, so they share memory with the fused copy."""
    weight = torch.cat([lin.weight.detach() for lin in linears])  # [sum N_i, K]
    biases = [lin.bias for lin in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[row:row + n], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[row:row + n], requires_grad=False)
        row += n
    return weight, bias


class _FusedProjections(nn.Module):
    """Base for modules that keep a fused copy of several nn.Linear children.

    The fused weight is a non-persistent buffer (it moves with .to() and stays out of state
    dicts); it is rebuilt after every load_state_dict and at construction on a real device.
    """

    def _fused_children(self) -> list[nn.Linear]:
        raise NotImplementedError

    def _init_fusion(self) -> None:
        self.register_buffer("fused_weight", None, persistent=False)
        self.register_buffer("fused_bias", None, persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refuse())
        if self._fused_children()[0].weight.device.type != "meta":
            self.refuse()

    def _fusable(self) -> bool:
        """Float nn.Linear children only: GGUF-native children (GGUFLinear) keep their own
        blocks, each in its own type, and are called one by one."""
        return all(isinstance(child, nn.Linear) for child in self._fused_children())

    def refuse(self) -> None:
        """Rebuild the fused weight from the children (call after replacing a child's weight)."""
        if not self._fusable():
            self.fused_weight = self.fused_bias = None
            return
        if self._fused_children()[0].weight.device.type == "meta":
            return
        with torch.no_grad():
            self.fused_weight, self.fused_bias = _fuse_rows(self._fused_children())


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


class LlamaAttention(_FusedProjections):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.window = config.layer_window(layer_idx)  # None = full attention
        self.softcap = config.attn_logit_softcapping
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)
        # Qwen3, Gemma 3: RMS norm of each head's q and k (over head_dim) before rope.
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        # The kernel's fused (q/k norm,) rope + cache write rotates whole heads of the projections.
        self.kernel_rope = config.rotary_dim == config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.quantize_inputs = False  # set_decode_weight_format: int8 weights quantize GEMM inputs
        # (qkv, o) as PackedInteger while an int8 model's fused stack exists (attach_packed_int8).
        self.packed: tuple[PackedInteger, PackedInteger] | None = None
        self._init_fusion()

    def _fused_children(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj]

    def _qkv(self, x: torch.Tensor, kernels: ModuleType | None) -> torch.Tensor:
        """x: [T, H] -> [T, q_size + 2 kv_size] (q heads, k heads, v heads)."""
        if self.fused_weight is None:  # GGUF-native projections: one call, each its own blocks
            return linear_side_by_side(x, [self.q_proj, self.k_proj, self.v_proj])
        return fused_linear(x, self.fused_weight, self.fused_bias, kernels, self.quantize_inputs)

    def _heads(self, qkv: torch.Tensor, cos: torch.Tensor | None,
               sin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, Hq*D + 2*Hkv*D] -> q [T, Hq, D], k, v [T, Hkv, D]: q/k norms, then rope
        (cos, sin [T, rotary_dim]; None on a layer without rope)."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                meta: AttentionMetadata, kv: KVCache) -> torch.Tensor:
        """The pure-torch path (any device): x [T, H] -> [T, H]."""
        q, k, v = self._heads(self._qkv(x, None), cos, sin)
        attn = paged_attention(q, k, v, kv.k[self.layer_idx], kv.v[self.layer_idx], meta, self.scale,
                               self.window, self.softcap)
        return self.o_proj(attn.reshape(x.shape[0], -1))

    def _kernel_window(self, q: torch.Tensor, meta: AttentionMetadata,
                       kernels: ModuleType) -> tuple[bool, int | None]:
        """(whether the compiled attention kernels compute this layer's attention for this step
        exactly, the window they apply): never with a soft-cap; with no window or one that
        excludes no key of any sequence (every context within it, the common case for Mistral's
        4096 or Gemma's 512-4096 windows: a query at position p < window sees every key) any
        kernel, without one; a window that excludes keys only in the float32 paged kernel (the
        fused GGUF stack's attention: both give a row the same bits)."""
        if self.softcap is not None:
            return False, None
        if self.window is None or max(meta.seq_lens_host) <= self.window:
            return True, None
        return rows_share_decode_kernel(q, kernels), self.window

    def forward_cpu(self, x: torch.Tensor, cos32: torch.Tensor | None, sin32: torch.Tensor | None,
                    meta: AttentionMetadata, kv: KVCache, kernels: ModuleType) -> torch.Tensor:
        """The compiled-kernel path: x [T, H]; cos32, sin32: [T, rotary_dim] float32 (None on a
        layer without rope) -> [T, H]. Pieces the kernels lack run in torch: partial rope (then
        the q/k norms and the cache write too), and attention with soft-capping or a window
        that excludes keys this step where the float32 paged kernel cannot take it (_kernel_window)."""
        num_tokens = x.shape[0]
        k_cache, v_cache = kv.k[self.layer_idx], kv.v[self.layer_idx]
        packed = self.packed if _uses_packed(self.packed, x) else None
        qkv = self._project_qkv(x, packed, kernels)  # [T, Hq*D + 2*Hkv*D]
        if self.kernel_rope:
            q, k_new, v_new = self._rope_write(qkv, cos32, sin32, meta.slot_mapping, kv, kernels)
        else:
            cos = None if cos32 is None else cos32.to(qkv.dtype)
            sin = None if sin32 is None else sin32.to(qkv.dtype)
            q, k_new, v_new = self._heads(qkv, cos, sin)
            q = q.contiguous()
            write_kv(k_cache, v_cache, k_new, v_new, meta.slot_mapping)
        kernel_attends, window = self._kernel_window(q, meta, kernels)
        if not kernel_attends:
            attn = cached_attention(q, k_cache, v_cache, meta, self.scale, self.window, self.softcap)
        else:
            attn = paged_attention_cpu(kernels, q, k_new, v_new, k_cache, v_cache, meta,
                                       self.scale, window)  # [T, Hq, D]
        return self._project_o(attn.reshape(num_tokens, -1), packed, kernels)

    def rows_split_exactly(self, x: torch.Tensor, meta: AttentionMetadata, kernels: ModuleType) -> bool:
        """Whether forward_cpu_rows gives any block of this step's rows the bits forward_cpu
        gives them: GEMMs that compute each row alone (the packed ones, or GGUF blocks), the
        kernels' rope and cache write (per row), and every row's attention through the paged
        decode kernel over its own context [0, position] (a row needs only the keys of earlier
        rows, written by earlier blocks)."""
        q_like = x.new_empty(0, self.num_heads, self.head_dim)
        if not (self.kernel_rope and rows_share_decode_kernel(q_like, kernels)
                and self._kernel_window(q_like, meta, kernels)[0]):
            return False
        return _uses_packed(self.packed, x) or _gguf_blocks([self.q_proj, self.k_proj, self.v_proj, self.o_proj])

    def forward_cpu_rows(self, x: torch.Tensor, rows: slice, cos32: torch.Tensor | None,
                         sin32: torch.Tensor | None, meta: AttentionMetadata, kv: KVCache,
                         kernels: ModuleType) -> torch.Tensor:
        """forward_cpu of the rows `rows` of the step's x [T, H] (in order, after every earlier
        block), where rows_split_exactly -> [n, H]; stores their K/V."""
        x_rows = x[rows]  # [n, H]
        packed = self.packed if _uses_packed(self.packed, x) else None
        qkv = self._project_qkv(x_rows, packed, kernels)  # [n, Hq*D + 2*Hkv*D]
        cos_rows = None if cos32 is None else cos32[rows]
        sin_rows = None if sin32 is None else sin32[rows]
        q = self._rope_write(qkv, cos_rows, sin_rows, meta.slot_mapping[rows], kv, kernels)[0]
        window = self._kernel_window(q, meta, kernels)[1]
        k_cache, v_cache = kv.k[self.layer_idx], kv.v[self.layer_idx]
        attn = kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.row_seq_index[rows],
                                       meta.row_ctx_lens[rows], self.scale, window or 0)  # [n, Hq, D]
        return self._project_o(attn.reshape(x_rows.shape[0], -1), packed, kernels)

    def _project_qkv(self, x: torch.Tensor, packed: tuple | None, kernels: ModuleType) -> torch.Tensor:
        """x [T, H] -> qkv [T, Hq*D + 2*Hkv*D], contiguous (packed: the step's packed weights)."""
        if packed is not None:
            return packed[0].linear(x, self.fused_bias, kernels)
        return self._qkv(x, kernels).contiguous()

    def _rope_write(self, qkv: torch.Tensor, cos32: torch.Tensor | None, sin32: torch.Tensor | None,
                    slots: torch.Tensor, kv: KVCache, kernels: ModuleType
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kernels' (q/k norms,) rope and cache write of qkv [T, ...] (rotated in place; k, v
        stored at `slots`) -> q [T, Hq, D] contiguous, k_new, v_new [T, Hkv, D] (views)."""
        num_tokens = qkv.shape[0]
        if cos32 is None:  # no rope on this layer: the identity rotation
            cos32 = torch.ones(num_tokens, self.head_dim)
            sin32 = torch.zeros(num_tokens, self.head_dim)
        # Norms each q and k head (with q/k norms: the fused stacks' row function), rotates q
        # and k in place and stores k, v at their slots.
        norms = {}
        if self.q_norm is not None:
            norms = dict(q_norm=self.q_norm.weight.detach(), k_norm=self.k_norm.weight.detach(),
                         eps=self.q_norm.eps)
        kernels.rope_write_kv(qkv, cos32, sin32, self.num_heads, self.num_kv_heads,
                              kv.k[self.layer_idx], kv.v[self.layer_idx], slots, **norms)
        q = qkv[:, :self.q_size].reshape(num_tokens, self.num_heads, self.head_dim).contiguous()
        kv_new = qkv[:, self.q_size:].view(num_tokens, 2, self.num_kv_heads, self.head_dim)
        return q, kv_new[:, 0], kv_new[:, 1]

    def _project_o(self, attn: torch.Tensor, packed: tuple | None, kernels: ModuleType) -> torch.Tensor:
        """attention [T, Hq*D] -> o projection [T, H]."""
        if packed is not None:
            return packed[1].linear(attn, None, kernels)
        if not isinstance(self.o_proj, nn.Linear):  # GGUF-native: its own blocks
            return self.o_proj(attn)
        return fused_linear(attn, self.o_proj.weight, None, kernels, self.quantize_inputs)


class LlamaMLP(_FusedProjections):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one fused GEMM; GeGLU (Gemma) with
    gelu's tanh approximation in place of silu."""

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None):
        """intermediate_size: the width (default config.intermediate_size; an MoE expert's is
        config.expert_intermediate_size)."""
        super().__init__()
        bias = config.mlp_bias
        width = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=bias)
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"
        # Whether packed[0] interleaves gate and up by blocks of 16 columns (the fused stack's
        # layout) or holds [gate | up] (LlamaForCausalLM._pack_per_op).
        self.packed_interleaved = True
        self.quantize_inputs = False  # set_decode_weight_format: int8 weights quantize GEMM inputs
        # (gate_up with halves interleaved by 16 columns, down) while an int8 stack exists.
        self.packed: tuple[PackedInteger, PackedInteger] | None = None
        self._init_fusion()

    def _fused_children(self) -> list[nn.Linear]:
        return [self.gate_proj, self.up_proj]

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The pure-torch path: x [T, H] -> [T, H]."""
        if self.fused_weight is None:
            return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self.fused_weight, self.fused_bias).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(self._act(gate) * up)

    def forward_cpu(self, x: torch.Tensor, kernels: ModuleType) -> torch.Tensor:
        """The compiled-kernel path: x [T, H] -> [T, H]."""
        if _uses_packed(self.packed, x):
            gate_up_packed, down = self.packed
            t = x.shape[0]
            gate_up = gate_up_packed.linear(x, self.fused_bias, kernels)  # [T, 2I]
            if self.packed_interleaved:
                # blocks of 16 gate columns then the matching 16 up columns -> [gate | up]
                gate_up = gate_up.view(t, -1, 2, 16).transpose(1, 2).reshape(t, -1)
            return down.linear(self._activated(gate_up, kernels), self.down_proj.bias, kernels)
        if self.fused_weight is None:  # GGUF-native projections, each in its own blocks
            gate_up = linear_side_by_side(x, [self.gate_proj, self.up_proj])  # [T, 2I]
            return self.down_proj(self._activated(gate_up, kernels))
        gate_up = fused_linear(x, self.fused_weight, self.fused_bias, kernels, self.quantize_inputs)  # [T, 2I]
        return fused_linear(self._activated(gate_up, kernels), self.down_proj.weight, self.down_proj.bias,
                            kernels, self.quantize_inputs)

    def rows_split_exactly(self, x: torch.Tensor) -> bool:
        """Whether forward_cpu computes each row of x [T, H] alone (so any block of them gets
        the bits the whole step does): the packed GEMMs or GGUF blocks, row-wise activation."""
        return _uses_packed(self.packed, x) or _gguf_blocks([self.gate_proj, self.up_proj, self.down_proj])

    def _activated(self, gate_up: torch.Tensor, kernels: ModuleType) -> torch.Tensor:
        """[gate | up] [T, 2I] -> act(gate) * up [T, I], contiguous."""
        if self.gelu and gate_up.dtype == torch.float32 and hasattr(kernels, "gelu_tanh_mul"):
            # float32 GeGLU: the GGUF stack's row function (the same bits on both paths).
            return kernels.gelu_tanh_mul(gate_up.contiguous())
        if self.gelu:
            gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
            return (F.gelu(gate, approximate="tanh") * up).contiguous()
        return kernels.silu_mul(gate_up.contiguous())


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks. With sandwich norms (Gemma 2/3) the attention output
    is normed by post_attention_layernorm before the residual add, the MLP input by
    pre_feedforward_layernorm and its output by post_feedforward_layernorm (HF's names);
    without, post_attention_layernorm is the MLP's pre-norm (Llama)."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.sandwich = config.sandwich_norms
        # MoE layers (Qwen3-MoE, Mixtral): a router and experts, each a LlamaMLP of its width.
        self.mlp: nn.Module = (SparseMoeBlock(config, lambda width: LlamaMLP(config, width))
                               if config.layer_is_moe(layer_idx) else LlamaMLP(config))
        # Which of the model's rope tables this layer rotates with (None: no rope).
        self.rope_key = rope_key(config, layer_idx)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                meta: AttentionMetadata, kv: KVCache) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin, meta, kv)
        if not self.sandwich:
            x = x + attn
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def forward_cpu(self, normed: torch.Tensor, residual: torch.Tensor, next_norm: RMSNorm,
                    cos32: torch.Tensor | None, sin32: torch.Tensor | None, meta: AttentionMetadata,
                    kv: KVCache, kernels: ModuleType, between: BetweenLayers | None = None) -> torch.Tensor:
        """Compiled-kernel path. normed = input_layernorm(residual); residual [T, H] is updated in
        place (+= attention, += MLP); returns next_norm(residual), the next layer's input.
        `between` is called once between the attention and the MLP (see LlamaForCausalLM.forward);
        PausePoints with a row block also pause between row blocks of the ops (_splits_rows)."""
        blocks = self._splits_rows(normed, meta, kernels, between)
        if not blocks:
            attn = self.self_attn.forward_cpu(normed, cos32, sin32, meta, kv, kernels)
        else:
            attn = torch.empty_like(residual)  # [T, H]
            for n, rows in enumerate(between.row_slices(normed.shape[0], "attention")):
                if n:
                    between.inside()
                attn[rows] = self.self_attn.forward_cpu_rows(normed, rows, cos32, sin32, meta, kv, kernels)
        mlp_norm = self.post_attention_layernorm
        if self.sandwich:
            attn = kernels.rms_norm(attn.contiguous(), mlp_norm.weight, mlp_norm.eps)
            mlp_norm = self.pre_feedforward_layernorm
        normed = kernels.add_rms_norm(residual, attn.contiguous(), mlp_norm.weight, mlp_norm.eps)
        if between is not None:
            between()
        if not blocks:
            mlp = self.mlp.forward_cpu(normed, kernels)
        else:
            mlp = torch.empty_like(residual)  # [T, H]
            for n, rows in enumerate(between.row_slices(normed.shape[0], "mlp")):
                if n:
                    between.inside()
                mlp[rows] = self.mlp.forward_cpu(normed[rows], kernels)
        if self.sandwich:
            post = self.post_feedforward_layernorm
            mlp = kernels.rms_norm(mlp.contiguous(), post.weight, post.eps)
        return kernels.add_rms_norm(residual, mlp, next_norm.weight, next_norm.eps)

    def _splits_rows(self, x: torch.Tensor, meta: AttentionMetadata, kernels: ModuleType,
                     between: BetweenLayers | None) -> bool:
        """Whether this step's attention and MLP run over row blocks (PausePoints.row_slices),
        with a pause point between two (PausePoints.inside), not whole: only where each row's
        numbers are the same in any block (invariant 1: rows_split_exactly), and the step is
        over one block. The norms and residual adds run whole after the blocks (they are per
        row anyway)."""
        if not isinstance(between, PausePoints) or not 0 < between.row_block < x.shape[0]:
            return False
        return (isinstance(self.mlp, LlamaMLP) and self.mlp.rows_split_exactly(x)
                and self.self_attn.rows_split_exactly(x, meta, kernels))


GLOBAL_ROPE, LOCAL_ROPE = "global", "local"


def rope_key(config: ModelConfig, layer: int) -> str | None:
    """The rope table a layer uses: LOCAL_ROPE on sliding-window layers of a model with its own
    local base (Gemma 3), GLOBAL_ROPE elsewhere, None on layers without rope (SmolLM3)."""
    if not config.layer_has_rope(layer):
        return None
    if config.rope_local_theta is not None and config.layer_window(layer) is not None:
        return LOCAL_ROPE
    return GLOBAL_ROPE


def rotary_embeddings(config: ModelConfig) -> dict[str, RotaryEmbedding]:
    """The model's rope variants by rope_key: global (rope_theta with the config's scaling) and,
    where the config has one, local (rope_local_theta, unscaled)."""
    tables = {GLOBAL_ROPE: RotaryEmbedding(config.rope_theta, config.rotary_dim,
                                           config.max_position_embeddings, config.rope_scaling)}
    if config.rope_local_theta is not None:
        tables[LOCAL_ROPE] = RotaryEmbedding(config.rope_local_theta, config.rotary_dim,
                                             config.max_position_embeddings)
    return tables


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
        self.rotary = rotary_embeddings(config)
        # The fused decode stack and packed LM head (CPU bf16 fast path) hold packed copies of
        # the weights: built on first use, dropped when weights are loaded again.
        self._decode_stack = None
        self._packed_lm_head = None
        # Storage of the float32 fast path's packed weights: float32, bf16 or int8 (the loader
        # sets it from `--quantization`; fused_decode.resolve_weight_format).
        self.decode_weight_format = "float32"
        self._float_weights_released = False  # release_float_weights
        # pin_invariant_gemms (--deterministic): float32 / bf16 weights packed for every row count.
        self.invariant_gemms = False
        self.register_load_state_dict_post_hook(lambda module, _keys: module.drop_packed_weights())

    def drop_packed_weights(self) -> None:
        """Forget the packed weight copies (call after changing weights in place)."""
        self._check_float_weights("repacking the weights")
        self._decode_stack = None
        self._packed_lm_head = None
        for layer in self.model.layers:
            for module in (layer.self_attn, *layer_mlps(layer)):
                module.packed = None

    def release_float_weights(self) -> bool:
        """Free the decoder layers' float32 GEMM weights where every CPU path computes on the
        fused stack's packed integer copies (int8 / int4 models with the stack built and
        attached to the per-op path at every row count): for SmolLM2 from its Q4_1 file, ~405
        MiB of float32 it no longer reads, next to ~60 MiB of packed int4. An engine that owns its
        model calls it after warming up; the model then refuses the pure-torch path and
        weight changes (ValueError). False, and nothing freed, where some path still needs
        the float32 weights."""
        if self._float_weights_released:
            return True
        layers = self.model.layers
        if (PACKED_GEMM_MAX_ROWS is not None or not self._decode_stack or not layers
                or any(layer.self_attn.packed is None or layer.mlp.packed is None for layer in layers)):
            return False
        with torch.no_grad():
            for layer in layers:
                attn, mlp = layer.self_attn, layer.mlp
                for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                            mlp.up_proj, mlp.down_proj):
                    # [0, in_features]: the module keeps its shape contract, holds no rows.
                    lin.weight = nn.Parameter(lin.weight.new_empty(0, lin.in_features),
                                              requires_grad=False)
                attn.fused_weight = mlp.fused_weight = None  # fused_bias stays: packed qkv adds it
        self._float_weights_released = True
        _return_freed_memory()
        return True

    def pin_invariant_gemms(self) -> None:
        """Run every GEMM of the float32 path on packed weights at every row count, also where
        they are stored as float32 or bf16 (--deterministic). Integer weights already do (the
        default: int4 / int8), and so a row's sums over K then never depend on its step's row
        count (batch-invariant greedy results, docs/ARCHITECTURE.md invariant 1); float formats
        otherwise leave steps over PACKED_FLOAT_MAX_ROWS rows to torch's GEMM, whose reduction
        order follows the matrix shape. Costs prefill speed on float32 weights (the packed
        float kernels are slower than torch's GEMM on long prompts)."""
        if self.invariant_gemms:
            return
        self.invariant_gemms = True
        if not self._float_weights_released:
            self.drop_packed_weights()

    def _check_float_weights(self, what: str) -> None:
        if self._float_weights_released:
            raise ValueError(f"{what} needs the float32 weights, released by release_float_weights() "
                             "(the engine computes on the packed integer copies)")

    def set_decode_weight_format(self, fmt: str) -> None:
        """Store the float32 fast path's weights as `fmt` (float32, bf16 or int8): the model's
        GEMM weights become the values of their compressed packed copies
        (fused_decode.round_weights_to_format), so every path computes with the same weights."""
        self._check_float_weights("set_decode_weight_format")
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; use one of {sorted(WEIGHT_FORMATS)}")
        if fmt != "float32" and self.lm_head.weight.dtype != torch.float32:
            raise ValueError(f"{fmt} weight storage is for float32 compute (got {self.lm_head.weight.dtype})")
        self.decode_weight_format = fmt
        resolved = resolve_weight_format(self)
        round_weights_to_format(self, resolved)
        for layer in self.model.layers:
            for module in (layer.self_attn, *layer_mlps(layer)):
                module.quantize_inputs = resolved in INTEGER_FORMATS
        self.drop_packed_weights()

    def prepare_fast_path(self) -> None:
        """Pack the CPU bf16 fast path's weights now (~0.4 s for SmolLM2), so that the first
        decode step does not pay for it. A no-op where that path does not apply."""
        if self.native_gguf:
            return
        kernels = cpu_kernels_for(self.lm_head.weight)
        if kernels is not None:
            self._stack_for(kernels)
            self._lm_head_for(kernels)

    def decode_stack_team(self) -> int | None:
        """Threads the fused decode stack ran its last step on (1 while it runs solo because a
        neighbour process holds a core), None before it ran (diagnostics: perf_bench)."""
        stack = self._decode_stack
        return (stack.last_team or None) if stack else None

    def mark_native_gguf(self) -> None:
        """This model's matrices are GGUF blocks (gguf_native.build_native_model): every path
        calls the GGUFLinear modules, the fused stack included (gguf_stack.py); no packed copies."""
        self.decode_weight_format = "gguf"
        self.drop_packed_weights()

    @property
    def native_gguf(self) -> bool:
        return self.decode_weight_format == "gguf"

    def _stack_for(self, kernels: ModuleType):
        """The fused decode stack (built once), or False where the model's shapes rule it out."""
        if self.native_gguf:
            if self._decode_stack is None:  # on the GGUF blocks themselves (gguf_stack.py)
                self._decode_stack = build_gguf_decode_stack(self, kernels) or False
            return self._decode_stack
        if self._decode_stack is None:
            self._decode_stack = build_decode_stack(self, kernels) or False
            self._attach_packed_int8(self._decode_stack)
            self._attach_packed_head(self._decode_stack, kernels)
            if not self._decode_stack:
                self._pack_per_op(kernels)
        return self._decode_stack

    def _attach_packed_head(self, stack, kernels: ModuleType) -> None:
        """Give the float32 stack the packed LM head (the one compute_logits runs, shared, not
        copied) for forward_logits: a decode step's head and argmax in the stack's parallel
        region. At b1 the separate head cost a second wake-up of the team, its Python and a fresh
        [T, vocab] block's page faults every step. Not where the head has no packed float32 copy
        (a bf16 model's stack) or caps its logits (computed after the head, outside the stack)."""
        if not stack or not hasattr(stack, "attach_head") or self.config.final_logit_softcapping is not None:
            return
        packed = self._lm_head_for(kernels)
        if isinstance(packed, tuple):
            data, scales, fmt = packed
            stack.attach_head(data=data, scales=scales, format=fmt, N=self.config.vocab_size)

    def _pack_per_op(self, kernels: ModuleType) -> None:
        """Without the fused stack (families other than plain Llama), a float32 model on a CPU
        with the float32 kernels packs its per-op GEMM weights in its storage format
        (decode_weight_format) for linear_packed_f32: the stack's GEMMs, one call per projection
        (PACKED_FLOAT_MAX_ROWS says which steps use them)."""
        if (self.lm_head.weight.dtype != torch.float32 or not has_f32_stack(kernels)
                or not self.model.layers or self.model.layers[0].self_attn.fused_weight is None):
            return
        fmt = WEIGHT_FORMATS[resolve_weight_format(self)]

        def packed(weight: torch.Tensor) -> PackedInteger:
            data, scales = kernels.pack_weight_f32(weight.detach(), fmt)
            return PackedInteger(data, scales, weight.shape[0], fmt, self.invariant_gemms)

        for layer in self.model.layers:
            attn = layer.self_attn
            attn.packed = (packed(attn.fused_weight), packed(attn.o_proj.weight))
            for mlp in layer_mlps(layer):  # an MoE layer's experts each (its router stays float)
                mlp.packed = (packed(mlp.fused_weight), packed(mlp.down_proj.weight))
                mlp.packed_interleaved = False

    def _attach_packed_int8(self, stack) -> None:
        """Point the per-op path's GEMMs of an int8 / int4 model (or, after pin_invariant_gemms,
        of any float32-compute model) at the stack's packed weights (PACKED_GEMM_MAX_ROWS):
        shared, not copied."""
        fmt = getattr(stack, "weight_format", None) if stack else None
        integer = fmt in [WEIGHT_FORMATS[f] for f in INTEGER_FORMATS]
        if not (integer or (self.invariant_gemms and fmt is not None)) or not hasattr(stack, "packed_layer"):
            return
        all_rows = not integer
        c = self.config
        qkv_n, gate_up_n = c.q_size + 2 * c.kv_size, 2 * c.intermediate_size
        for i, layer in enumerate(self.model.layers):
            layer.mlp.packed_interleaved = True
            t = stack.packed_layer(i)
            layer.self_attn.packed = (PackedInteger(t[0], t[1], qkv_n, fmt, all_rows),
                                      PackedInteger(t[2], t[3], c.hidden_size, fmt, all_rows))
            layer.mlp.packed = (PackedInteger(t[4], t[5], gate_up_n, fmt, all_rows),
                                PackedInteger(t[6], t[7], c.hidden_size, fmt, all_rows))

    def _lm_head_for(self, kernels: ModuleType):
        """The LM head packed once for the fast path of the model's dtype: for
        kernels.linear_packed_bf16 (bf16, AVX512-BF16) or a (data, scales, format) triple for
        kernels.linear_packed_f32 (float32, AVX2); None where neither applies."""
        if not isinstance(self.lm_head, nn.Linear):
            return None  # GGUF-native head: its own blocks
        if self._packed_lm_head is None:
            weight = self.lm_head.weight.detach()
            if weight.dtype == torch.bfloat16 and kernels.has_avx512bf16():
                self._packed_lm_head = kernels.pack_linear_bf16(weight, False)
            elif weight.dtype == torch.float32 and has_f32_stack(kernels):
                fmt = WEIGHT_FORMATS[lm_head_format(resolve_weight_format(self))]
                self._packed_lm_head = (*kernels.pack_weight_f32(weight, fmt), fmt)
        return self._packed_lm_head

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config says so (call after load)."""
        if self.config.tie_word_embeddings and isinstance(self.model.embed_tokens, nn.Embedding):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: KVCache, use_kernels: bool = True,
                between_layers: BetweenLayers | None = None) -> torch.Tensor:
        """input_ids, positions: [T] -> final-norm hidden states [T, hidden_size].

        use_kernels=False forces the pure-torch path (the reference the fast path is tested
        against); otherwise the compiled CPU kernels run when they are available for this
        device and dtype.

        between_layers: called between two layers (and between a layer's attention and its
        MLP) of the layer-by-layer paths, not inside the fused decode stack. It may run a whole
        other forward on this model and cache (an interjected short prompt): this forward's
        own state lives in its local tensors, and the other one writes other KV blocks. A
        PausePoints (model/pause_points.py) is also offered the pauses between row blocks of a
        layer's ops, where each row's numbers do not depend on the blocks
        (LlamaDecoderLayer._splits_rows).
        """
        x = self._embed(input_ids)  # [T, H]
        kernels = self._kernels_for(x, kv) if use_kernels else None
        if kernels is not None:
            return self._forward_cpu(x, positions, meta, kv, kernels, between_layers)
        self._check_float_weights("the pure-torch forward")
        tables = self._rope_tables(positions, x.dtype, meta)
        for i, layer in enumerate(self.model.layers):
            if i and between_layers is not None:
                between_layers()
            x = layer(x, *tables[layer.rope_key], meta, kv)
        return self.model.norm(x)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> embeddings [T, H] in the model's dtype."""
        x = self.model.embed_tokens(input_ids)  # [T, H]
        if self.config.embedding_multiplier is not None:
            # HF Gemma: times sqrt(hidden) as a tensor of the hidden dtype (rounded to it).
            x = x * torch.tensor(self.config.embedding_multiplier, dtype=x.dtype)
        return x

    @staticmethod
    def _kernels_for(x: torch.Tensor, kv: KVCache) -> ModuleType | None:
        """The CPU kernels for embeddings x, or None: the kernels read a cache in the compute
        dtype, or float16 / bf16 under float32."""
        kv_ok = kv.dtype == x.dtype or (x.dtype == torch.float32 and kv.dtype in (torch.float16, torch.bfloat16))
        return cpu_kernels_for(x) if kv_ok else None

    def forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv: KVCache, sample_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step whose every row is sampled, through the fused stack with the LM head in its
        parallel region (the GGUF stack, or the float32 one with its packed head): (logits [T, V]
        float32, their argmax [T] int64), the values forward then compute_logits_and_argmax give
        (the same kernels and bits), without the head's own parallel region (a second wake-up of
        the threads), its Python and the separate argmax. None where that does not apply (then
        the caller runs forward and compute_logits_and_argmax): no stack with a head, not every
        row a sample row (a prompt chunk), or a step the stack does not take."""
        stack = self._decode_stack
        T = input_ids.shape[0]
        if (not stack or not getattr(stack, "head_size", 0) or sample_rows.shape[0] != T
                or self.config.final_logit_softcapping is not None or not step_fits_stack(T, meta)):
            return None  # before embedding: the caller's forward embeds the rows itself
        # sample_rows are the chunks' last rows in order: T of them over T rows is every row, in order.
        x = self._embed(input_ids)
        kernels = self._kernels_for(x, kv)
        if kernels is None or self._stack_for(kernels) is not stack or not takes_stack(x, meta):
            return None
        # On pages the stack keeps mapped between steps (torch.empty's fresh 16 MB for 32 rows of a
        # 128k vocabulary cost ~1000 page faults a step); reused only once this step's is dropped.
        logits = stack.new_logits(T)
        argmax = torch.empty(T, dtype=torch.int64)
        self._stack_forward(stack, x, self._rope_tables(positions, torch.float32, meta), meta, kv,
                            logits=logits, argmax=argmax)
        return logits, argmax

    def _stack_forward(self, stack, x: torch.Tensor, tables: dict, meta: AttentionMetadata, kv: KVCache,
                       **head) -> torch.Tensor:
        """The fused stack's forward of the step's embeddings x [T, H] with the float32 rope
        tables (the local one too where sliding layers have their own base: Gemma 3) and the
        layers' attention scale; `head`: logits / argmax outputs (a stack with its head)."""
        cos32, sin32 = tables[GLOBAL_ROPE]
        if LOCAL_ROPE in tables:
            head = dict(head, cos_local=tables[LOCAL_ROPE][0], sin_local=tables[LOCAL_ROPE][1])
        return stack.forward(x.contiguous(), cos32, sin32, kv.storage, meta.slot_mapping, meta.block_tables,
                             meta.row_seq_index, meta.row_ctx_lens, self.model.layers[0].self_attn.scale, **head)

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype, meta: AttentionMetadata
                     ) -> dict[str | None, tuple[torch.Tensor | None, torch.Tensor | None]]:
        """(cos, sin) [T, rotary_dim] of each rope variant for this step's positions, and
        (None, None) under the key of layers without rope. The step's own positions end before
        its longest sequence's end (meta's host copy), so the variants' row tables serve them
        (other positions, from a caller of forward, are computed)."""
        end = max(meta.seq_lens_host) if positions is meta.positions else None
        tables = {key: rope.cos_sin(positions, dtype, end) for key, rope in self.rotary.items()}
        tables[None] = (None, None)
        return tables

    def _forward_cpu(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                     kv: KVCache, kernels: ModuleType,
                     between_layers: BetweenLayers | None = None) -> torch.Tensor:
        tables = self._rope_tables(positions, torch.float32, meta)  # float32 cos, sin [T, rotary_dim]
        # Built on the first step of any shape: an int8 model's per-op GEMMs use its weights.
        stack = self._stack_for(kernels)
        if stack and takes_stack(x, meta):
            return self._stack_forward(stack, x, tables, meta, kv)
        layers = self.model.layers
        residual = x.contiguous()  # [T, H], updated in place by every layer
        normed = kernels.rms_norm(residual, layers[0].input_layernorm.weight,
                                  layers[0].input_layernorm.eps)
        for i, layer in enumerate(layers):
            if i and between_layers is not None:
                between_layers()
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            normed = layer.forward_cpu(normed, residual, next_norm, *tables[layer.rope_key], meta, kv,
                                       kernels, between_layers)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden_size] (only the rows to sample) -> logits [S, vocab_size] float32."""
        return self.compute_logits_and_argmax(hidden)[0]

    def compute_logits_and_argmax(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [S, vocab_size] float32, their argmax [S] int64 or None): the CPU bf16 path
        takes the argmax (greedy sampling's answer) inside the LM head's GEMM, other paths
        leave it to the sampler (None)."""
        logits, argmax = self._logits_and_argmax(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            # Gemma 2: cap * tanh(logits / cap); the sampler takes the argmax of these.
            return torch.tanh(logits / cap) * cap, None
        return logits, argmax

    def _logits_and_argmax(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(self.lm_head, nn.Linear):  # GGUF-native head
            return self.lm_head(hidden).float(), None
        kernels = cpu_kernels_for(hidden)
        packed = self._lm_head_for(kernels) if kernels is not None and hidden.dtype == self.lm_head.weight.dtype else None
        if isinstance(packed, tuple):
            # float32 compute on the compressed packed copy; argmax from the GEMM's epilogue.
            data, scales, fmt = packed
            argmax = torch.empty(hidden.shape[0], dtype=torch.int64)
            logits = kernels.linear_packed_f32(hidden.contiguous(), data, scales, fmt, self.config.vocab_size,
                                               None, argmax)
            return logits, argmax
        if packed is not None:
            # The LM head is the largest GEMM of a decode step: packed once, it streams at
            # memory speed for one row and runs the dot-product units for a whole batch.
            # float_out: bf16-rounded logits written as float32 in the GEMM's epilogue (the same
            # values as .float() of the bf16 result, without a second pass over [S, V]); the
            # epilogue also tracks each row's argmax, so greedy sampling does not read the
            # 12 MB of a 64-row batch's logits back from memory.
            argmax = torch.empty(hidden.shape[0], dtype=torch.int64)
            logits = kernels.linear_packed_bf16(hidden.contiguous(), packed, self.config.vocab_size,
                                                None, float_out=True, argmax_out=argmax)
            return logits, argmax
        return fused_linear(hidden, self.lm_head.weight, None, kernels).float(), None
