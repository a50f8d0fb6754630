"""Causal attention of prefill chunks on CPU: C++ flash-attention kernels, or blocked matmuls.

kernels.prefill_attention_f32 (kernels/avx2/prefill_attention_f32.cpp: AVX2 FMA tiles, online
softmax, causal key blocks only) serves float32 chunks on every tier with AVX2; measured on one
Zen 3 core at 512 / 2048 tokens (SmolLM2 shapes): 55 / 60 GFLOP/s (causal half counted) against
torch SDPA's 30 / 50. The engine's float32 path no longer calls it: its prompt rows go through the
paged decode kernel, whose arithmetic per row does not depend on the step (attention_cpu.py,
issue 31); it stays for benchmarks/prefill_attention_bench.py and direct callers.

With the compiled kernels (AVX512-BF16 built in, head_dim 64 or 128), bf16 prefill chunks go to
kernels.prefill_attention (kernels/prefill_attention.cpp: vdpbf16ps tiles, online softmax, causal
key blocks only), chunks that continue a cached context reading it through the block table.
Measured on the 2-core AVX512-BF16 CPU (SmolLM2-135M shapes; benchmarks/prefill_attention_bench.py):
~180 GFLOP/s per core (causal half counted), ~350 with both cores free at 2048 tokens, 2.2-2.7x
the blocked matmuls below at 256-2048 tokens over a 2048 context, 3x SDPA; faster than SDPA
from one token on.

Without the kernel (not built, other head dims), long bf16 chunks take blocked_causal_attention,
also the kernel's reference in the tests. torch's CPU flash attention reaches well under half
the bf16 GEMM rate for a long causal prompt; this runs the same attention as a few large
matmuls instead. The query heads that share a KV head are stacked into the matmul's row
dimension (GQA: one matmul serves the whole group), queries are cut into blocks, and each block
multiplies only the causal prefix of the keys (fully masked key columns are never computed).
Only the last `block` key columns of a block need a mask. Scores come out of the matmul in bf16
(fp32 accumulation, one rounding); softmax computes in fp32 internally and rounds the
probabilities to bf16 for the value matmul, as flash attention does. ~1.2-1.7x faster than SDPA
for the attention alone at 2048 tokens. Any dtype works (the tests run it in fp32 too); only
bf16 uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from cadence.model.attention_metadata import AttentionMetadata

# Query rows per block (per head): big enough for GEMM efficiency, small enough that one score
# block ([group * block, context] bf16) stays near the L2 cache.
QUERY_BLOCK = 192
# Without the kernel, bf16 prefill chunks with at least this many new tokens take the blocked
# matmuls (blocked_causal_attention), shorter ones SDPA. Whole-prefill
# A/B runs gained ~10-15% at 1024 and 2048 tokens; at 512 the result flipped from run to run
# (attention is a small share there), so shorter chunks stay on SDPA.
MIN_CHUNK = 1024
# With the C++ kernel: every chunk from position 0 takes it (faster than SDPA from 1 token on),
# and chunks continuing a cached context from this many new tokens on (below, the paged decode
# kernel's one row per token wins; both read the cache through the block table). float32: one
# item of the kernel is 24 stacked rows, 8 tokens of a 3-query-head group.
KERNEL_MIN_CONTINUING = {torch.bfloat16: 3, torch.float32: 8}
KERNEL_HEAD_DIMS = (64, 128)
# Builds whose float32 prefill kernel (AVX2 FMA) is in use.
F32_KERNEL_TIERS = ("avx2", "avx512", "avx512bf16")

PrefillKernel = Callable[..., torch.Tensor]


def prefill_kernel(q: torch.Tensor, kernels: ModuleType | None) -> PrefillKernel | None:
    """The compiled causal prefill kernel that serves queries q, else None: bf16 on CPU with
    AVX512-BF16 compiled in (kernels.prefill_attention), float32 on CPU with the AVX2 tier or
    above (kernels.prefill_attention_f32); head_dim 64 or 128. Either is called as
    (q, keys, values, scale, block_table | None, ctx_len)."""
    if kernels is None or q.device.type != "cpu" or q.shape[-1] not in KERNEL_HEAD_DIMS:
        return None
    if q.dtype == torch.bfloat16 and kernels.has_avx512bf16():
        return kernels.prefill_attention
    if (q.dtype == torch.float32 and hasattr(kernels, "prefill_attention_f32")
            and kernels.kernel_tier() in F32_KERNEL_TIERS):
        return kernels.prefill_attention_f32
    return None


def takes_blocked(q: torch.Tensor, n_new: int, start_pos: int = 0,
                  kernels: ModuleType | None = None) -> bool:
    """Whether a prefill chunk of n_new tokens from start_pos with queries q goes through
    blocked_over_context (a C++ kernel when one serves q, else bf16's blocked matmuls)."""
    if prefill_kernel(q, kernels) is not None:
        return start_pos == 0 or n_new >= KERNEL_MIN_CONTINUING[q.dtype]
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return False
    return n_new >= MIN_CHUNK


def blocked_over_context(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                         i: int, scale: float, kernels: ModuleType | None = None) -> torch.Tensor:
    """Sequence i's prefill chunk (q, k_new, v_new: its rows only) over its own new keys when it
    starts at position 0, else over its whole context in the cache: through the C++ kernel when
    it serves q (reading the cache through the block table), else blocked_causal_attention
    (the context gathered once)."""
    start_pos, seq_len = meta.start_pos_host[i], meta.seq_lens_host[i]
    kernel = prefill_kernel(q, kernels)
    if kernel is not None and start_pos == 0:
        return kernel(q, k_new, v_new, scale, None, -1)
    if kernel is not None and k_cache.dtype == q.dtype:  # (it reads a cache of q's dtype only)
        return kernel(q, k_cache, v_cache, scale, meta.block_tables[i], seq_len)
    if start_pos == 0:
        keys, values = k_new, v_new
    else:
        blocks = meta.block_tables[i, : meta.num_blocks_host[i]]
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].to(q.dtype)  # [seq_len, Hkv, D]
        values = v_cache[blocks].flatten(0, 1)[:seq_len].to(q.dtype)
    if kernel is not None:
        return kernel(q, keys.contiguous(), values.contiguous(), scale, None, -1)
    return blocked_causal_attention(q, keys, values, scale, QUERY_BLOCK)


def causal_prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             scale: float, kernels: ModuleType | None = None) -> torch.Tensor:
    """q: [n, Hq, D]; keys, values: [L, Hkv, D] (L >= n, query j at position L - n + j) ->
    [n, Hq, D]: the C++ kernel when it serves q, else blocked_causal_attention."""
    kernel = prefill_kernel(q, kernels)
    if kernel is not None:
        return kernel(q, keys, values, scale, None, -1)
    return blocked_causal_attention(q, keys, values, scale, QUERY_BLOCK)


def blocked_causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             scale: float, block: int = QUERY_BLOCK) -> torch.Tensor:
    """q: [n, Hq, D]; keys, values: [L, Hkv, D], the whole context (L >= n) whose last n
    positions are the queries' own (query j sits at position L - n + j and sees keys <= it).
    Returns [n, Hq, D] in q's dtype.
    """
    n, num_heads, dim = q.shape
    ctx_len, num_kv_heads = keys.shape[:2]
    group = num_heads // num_kv_heads
    start_pos = ctx_len - n
    # [n, Hkv, G, D] -> [Hkv, n, G, D] -> [Hkv, n*G, D]: row m is query m // G of the group.
    qh = q.reshape(n, num_kv_heads, group, dim).transpose(0, 1).reshape(num_kv_heads, n * group,
                                                                       dim)
    qh = qh * scale  # exact in bf16 for power-of-two scales (head_dim 64: 1/8)
    kh = keys.transpose(0, 1).contiguous()  # [Hkv, L, D]
    vh = values.transpose(0, 1).contiguous()  # [Hkv, L, D]
    out = torch.empty(num_kv_heads, n * group, dim, dtype=q.dtype)
    # Within a block, row m (query r0 + m // G) may not see diagonal column c > m // G.
    block = min(block, n)
    diag_mask = torch.arange(block)[None, :] > torch.arange(block).repeat_interleave(group)[:, None]
    # As an additive 0 / -inf bias: add_ vectorizes far better than masked_fill_ here.
    diag_bias = torch.zeros(diag_mask.shape, dtype=q.dtype).masked_fill_(diag_mask, float("-inf"))
    for h in range(num_kv_heads):
        q_h, k_h, v_h, out_h = qh[h], kh[h], vh[h], out[h]
        for r0 in range(0, n, block):
            r1 = min(r0 + block, n)
            k_end = start_pos + r1  # keys [0, k_end) are visible to some row of this block
            scores = torch.mm(q_h[r0 * group:r1 * group], k_h[:k_end].t())  # [M, k_end]
            # Only the last r1 - r0 columns (the block's own positions) can be masked.
            rows = (r1 - r0) * group
            scores[:, start_pos + r0:].add_(diag_bias[:rows, :r1 - r0])
            probs = torch.softmax(scores, dim=-1)
            torch.mm(probs, v_h[:k_end], out=out_h[r0 * group:r1 * group])
    # [Hkv, n, G, D] -> [n, Hkv, G, D] -> [n, Hq, D]
    return out.view(num_kv_heads, n, group, dim).transpose(0, 1).reshape(n, num_heads, dim)
