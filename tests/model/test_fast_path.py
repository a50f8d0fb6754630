"""The compiled CPU fast path against the pure-torch reference on random paged inputs.

Attention: scattered block tables, varied sequence lengths, decodes mixed with prefill chunks
(from position 0 and continuing a context, short and long), float32 and bfloat16, head_dim 64
(vectorized kernel) and 8 (generic loop). Elementwise kernels and the small bf16 GEMM against
their torch formulas. Whole model: the fast forward against the reference forward.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from cadence.model.attention import paged_attention, write_kv
from cadence.model.attention_cpu import KERNEL_MAX_CHUNK, paged_attention_cpu
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.prefill_attention import (
    MIN_CHUNK,
    blocked_causal_attention,
    causal_prefill_attention,
    prefill_kernel,
)
from cadence.model.rope import apply_rope, rope_cos_sin

from .paged_helpers import bad_prefill_attention_calls, cache_slots, offset_causal_sdpa, scatter_to_cache

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="CPU kernels could not be built")

# dtype -> (atol, rtol): bf16 keeps 8 mantissa bits, so outputs of O(1) differ by a few 1e-3.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


def random_batch(seed: int, spans: list[tuple[int, int]], heads: int, kv_heads: int, dim: int,
                 block_size: int, dtype: torch.dtype):
    """Caches pre-filled with random context, scattered block tables, this step's q/k/v.

    spans: (start_pos, num_new_tokens) per sequence.
    """
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-(start + n) // block_size) for start, n in spans]
    pool = sum(needed) + 5
    order = list(range(pool))
    random.Random(seed).shuffle(order)
    tables, cursor = [], 0
    for count in needed:
        tables.append(order[cursor:cursor + count])
        cursor += count
    k_cache = torch.randn(pool, block_size, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(pool, block_size, kv_heads, dim, generator=gen).to(dtype)
    meta = AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, tables)], block_size, pool)
    total = meta.num_tokens
    q = torch.randn(total, heads, dim, generator=gen).to(dtype)
    k = torch.randn(total, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(total, kv_heads, dim, generator=gen).to(dtype)
    return q, k, v, k_cache, v_cache, meta


def run_both(q, k, v, k_cache, v_cache, meta, scale):
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = paged_attention(q, k, v, ref_k, ref_v, meta, scale)
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)  # the fast path's caller writes first
    got = paged_attention_cpu(KERNELS, q.contiguous(), k, v, k_cache, v_cache, meta, scale)
    return got, expected


SPANS = {
    "decodes": [(37, 1), (0, 1), (130, 1), (16, 1), (5, 1)],
    "mixed": [(40, 1), (0, 23), (9, 1), (50, 7), (0, 1), (17, KERNEL_MAX_CHUNK + 9)],
    "single long decode": [(700, 1)],
    # Rows enough for every thread, contexts longer than an L2-sized span: each row is cut into
    # spans anyway and merged.
    "long decodes": [(1500, 1), (1100, 1), (37, 1), (1800, 1), (600, 1)],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim, heads, kv_heads", [(64, 9, 3), (64, 4, 4), (8, 4, 2), (64, 10, 2),
                                             (64, 8, 2), (128, 16, 2)])  # groups 3, 1, 2, 5, 4, 8
@pytest.mark.parametrize("case", sorted(SPANS))
@pytest.mark.parametrize("block_size", [4, 16])
def test_fast_attention_matches_reference(dtype, dim, heads, kv_heads, case, block_size):
    q, k, v, k_cache, v_cache, meta = random_batch(
        hash((case, dim, block_size)) % 1000, SPANS[case], heads, kv_heads, dim, block_size, dtype)
    got, expected = run_both(q, k, v, k_cache, v_cache, meta, dim ** -0.5)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_attention_with_two_threads_and_one(dtype):
    q, k, v, k_cache, v_cache, meta = random_batch(3, SPANS["mixed"], 9, 3, 64, 16, dtype)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(run_both(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.125)[0])
    finally:
        torch.set_num_threads(before)
    # Every (row, head) item is computed by one thread, so the split cannot change the result.
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_matches_torch(dtype):
    torch.manual_seed(0)
    heads, kv_heads, dim, tokens, block_size = 9, 3, 64, 11, 4
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype)
    positions = torch.tensor([0, 1, 2, 3, 90, 91, 5, 600, 7, 8, 4000])
    cos, sin = rope_cos_sin(positions, dim, 100000.0, dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q_ref = apply_rope(q.reshape(tokens, heads, dim), cos, sin)
    k_ref = apply_rope(k.reshape(tokens, kv_heads, dim), cos, sin)
    k_cache = torch.zeros(8, block_size, kv_heads, dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([5, 0, 31, 2, 7, 8, 9, 10, 11, 12, 13])
    cos32, sin32 = rope_cos_sin(positions, dim, 100000.0, torch.float32)
    fused = qkv.clone()
    KERNELS.rope_write_kv(fused, cos32, sin32, heads, kv_heads, k_cache, v_cache, slots)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(fused[:, :heads * dim].reshape(tokens, heads, dim), q_ref,
                               atol=atol, rtol=rtol)
    flat_k = k_cache.view(-1, kv_heads, dim)
    torch.testing.assert_close(flat_k[slots], k_ref, atol=atol, rtol=rtol)
    assert torch.equal(v_cache.view(-1, kv_heads, dim)[slots], v.reshape(tokens, kv_heads, dim))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_with_qk_norms_is_rms_norm_per_head_then_rope(dtype):
    """Qwen3's per-head q/k norms inside rope_write_kv (the fused stacks' row function): each q and
    k head gets rms_norm's bits with its weight, v none; the rest is rope_write_kv's rotation.
    Close to the torch path (RMSNorm modules, then apply_rope)."""
    from cadence.model.llama import RMSNorm

    torch.manual_seed(1)
    heads, kv_heads, dim, tokens, eps = 6, 2, 64, 7, 1e-6
    qkv = (3 * torch.randn(tokens, (heads + 2 * kv_heads) * dim)).to(dtype)
    q_w, k_w = (1 + 0.1 * torch.randn(dim)).to(dtype), (1 + 0.1 * torch.randn(dim)).to(dtype)
    positions = torch.tensor([0, 1, 2, 30, 91, 500, 4000])
    cos32, sin32 = rope_cos_sin(positions, dim, 1e6, torch.float32)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    normed = torch.cat([KERNELS.rms_norm(q.reshape(-1, dim).contiguous(), q_w, eps).reshape(tokens, -1),
                        KERNELS.rms_norm(k.reshape(-1, dim).contiguous(), k_w, eps).reshape(tokens, -1), v], dim=-1)
    caches = [torch.zeros(4, 4, kv_heads, dim, dtype=dtype) for _ in range(4)]
    slots = torch.arange(tokens)
    expected = normed.contiguous()
    KERNELS.rope_write_kv(expected, cos32, sin32, heads, kv_heads, caches[0], caches[1], slots)
    got = qkv.clone()
    KERNELS.rope_write_kv(got, cos32, sin32, heads, kv_heads, caches[2], caches[3], slots, q_norm=q_w, k_norm=k_w,
                          eps=eps)
    assert torch.equal(got, expected) and torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    q_norm, k_norm = RMSNorm(dim, eps).to(dtype), RMSNorm(dim, eps).to(dtype)
    q_norm.weight.data.copy_(q_w)
    k_norm.weight.data.copy_(k_w)
    cos, sin = rope_cos_sin(positions, dim, 1e6, dtype)
    with torch.no_grad():
        q_ref = apply_rope(q_norm(q.reshape(tokens, heads, dim)), cos, sin)
        k_ref = apply_rope(k_norm(k.reshape(tokens, kv_heads, dim)), cos, sin)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got[:, :heads * dim].reshape(tokens, heads, dim), q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(caches[2].view(-1, kv_heads, dim)[slots], k_ref, atol=atol, rtol=rtol)
    with pytest.raises(RuntimeError, match="come together"):
        KERNELS.rope_write_kv(qkv.clone(), cos32, sin32, heads, kv_heads, caches[2], caches[3], slots, q_norm=q_w,
                              eps=eps)


@pytest.mark.parametrize("dim", [64, 128])
def test_rope_write_kv_bf16_rounds_every_op_like_eager(dim):
    # The bf16 kernel runs 16 dims at a time: bit-equal to rounding each product and sum to
    # bf16 (the eager path's order), signed zeros included.
    torch.manual_seed(dim)
    heads, kv_heads, tokens = 4, 2, 9
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).bfloat16()
    qkv[0, :8], qkv[1, :8] = 0.0, -0.0
    cos, sin = torch.randn(tokens, dim), torch.randn(tokens, dim)
    sin[2] = -0.0
    r = lambda x: x.bfloat16().float()  # noqa: E731
    half = dim // 2
    expected = qkv.float().view(tokens, -1, dim).clone()
    for head in range(heads + kv_heads):
        a, b = expected[:, head, :half].clone(), expected[:, head, half:].clone()
        expected[:, head, :half] = r(r(a * r(cos[:, :half])) + r(-b * r(sin[:, :half])))
        expected[:, head, half:] = r(r(b * r(cos[:, half:])) + r(a * r(sin[:, half:])))
    k_cache = torch.zeros(4, 4, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    got = qkv.clone()
    KERNELS.rope_write_kv(got, cos, sin, heads, kv_heads, k_cache, v_cache, torch.arange(tokens))
    assert torch.equal(got.view(torch.int16), expected.view(tokens, -1).bfloat16().view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_norms_and_silu_match_torch(dtype, rows):
    torch.manual_seed(rows)
    hidden = 72  # not a multiple of 16: the vector loop and its scalar tail both run
    x = torch.randn(rows, hidden).to(dtype)
    residual = torch.randn(rows, hidden).to(dtype)
    weight = torch.randn(hidden).to(dtype)
    eps = 1e-5

    def rms(t):
        t32 = t.float()
        return weight * (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)

    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(KERNELS.rms_norm(x, weight, eps), rms(x), atol=atol, rtol=rtol)
    summed = residual + x
    got_res = residual.clone()
    torch.testing.assert_close(KERNELS.add_rms_norm(got_res, x, weight, eps), rms(summed),
                               atol=atol, rtol=rtol)
    assert torch.equal(got_res, summed)
    gate_up = torch.randn(rows, 2 * hidden).to(dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(KERNELS.silu_mul(gate_up), F.silu(gate) * up, atol=atol, rtol=rtol)


@pytest.mark.skipif(KERNELS is None or not KERNELS.has_avx512bf16(), reason="no AVX512-BF16")
@pytest.mark.parametrize("rows", [1, 3, 4, 8])
@pytest.mark.parametrize("k_dim", [576, 64, 40])
def test_small_bf16_gemm_matches_float_reference(rows, k_dim):
    torch.manual_seed(k_dim)
    x = torch.randn(rows, k_dim).bfloat16()
    w = torch.randn(37, k_dim).bfloat16()
    expected = x.float() @ w.float().t()
    got = KERNELS.linear_bf16(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 37)
    # float32 accumulation, one bf16 rounding of the result.
    torch.testing.assert_close(got.float(), expected, atol=1e-2 * k_dim ** 0.5, rtol=1e-2)


def test_kernels_reject_bad_input():
    # A 16-bit cache under float32 queries is the float32 path's 16-bit KV cache; a float32
    # cache under bf16 queries, or K and V of different dtypes, is no path's.
    for q_dtype, k_dtype, v_dtype in ((torch.bfloat16, torch.float32, torch.float32),
                                      (torch.float32, torch.float16, torch.bfloat16)):
        with pytest.raises(RuntimeError, match="share q's dtype"):
            KERNELS.paged_attention(torch.zeros(1, 2, 8, dtype=q_dtype),
                                    torch.zeros(2, 4, 1, 8, dtype=k_dtype),
                                    torch.zeros(2, 4, 1, 8, dtype=v_dtype),
                                    torch.zeros(1, 1, dtype=torch.int32),
                                    torch.zeros(1, dtype=torch.int64),
                                    torch.ones(1, dtype=torch.int64), 1.0)
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        KERNELS.linear_bf16(torch.zeros(1, 8), torch.zeros(4, 8))
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match="outside pool"):
        KERNELS.paged_attention(torch.zeros(1, 2, 8), cache, cache.clone(),
                                torch.tensor([[5]], dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                torch.ones(1, dtype=torch.int64), 1.0)
    with pytest.raises(RuntimeError, match="ctx_len"):
        KERNELS.paged_attention(torch.zeros(1, 2, 8), cache, cache.clone(),
                                torch.tensor([[1]], dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                torch.tensor([9]), 1.0)
    with pytest.raises(RuntimeError, match="outside cache"):
        KERNELS.rope_write_kv(torch.zeros(1, 3 * 8), torch.zeros(1, 8), torch.zeros(1, 8), 1, 1,
                              cache, cache.clone(), torch.tensor([8]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_model_fast_forward_matches_reference_forward(request, arch, dtype):
    """Whole-model fast path (prefills then decodes, scattered blocks) vs the torch path."""
    from cadence.model.kv_cache import KVCache
    from cadence.model.loader import load_model

    loaded = load_model(request.getfixturevalue(f"tiny_{arch}_dir"), dtype=dtype, device="cpu")
    model, config = loaded.model, loaded.config
    torch.manual_seed(1)
    spans = [(0, 13), (0, 5)]
    tables = [[7, 2, 11, 4], [9, 0]]
    pool, block_size = 16, 4
    caches = [KVCache(config, pool, block_size, dtype, "cpu") for _ in range(2)]
    outputs = [[], []]
    for _ in range(3):
        meta = AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, tables)],
                                       block_size, pool)
        ids = torch.randint(0, config.vocab_size, (meta.num_tokens,))
        with torch.inference_mode():
            for j, use_kernels in enumerate((False, True)):
                hidden = model(ids, meta.positions, meta, caches[j], use_kernels=use_kernels)
                outputs[j].append(model.compute_logits(hidden))
        spans = [(s + n, 1) for s, n in spans]  # then two decode steps
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (5e-2, 5e-2)
    torch.testing.assert_close(torch.cat(outputs[1]), torch.cat(outputs[0]), atol=atol, rtol=rtol)


# Long bf16 prefill chunks: blocked causal attention (plain bf16 matmuls, GQA heads grouped).
LONG_SPANS = {
    "from zero": [(0, MIN_CHUNK + 261)],  # not a multiple of the query block
    "over cache": [(203, MIN_CHUNK + 77)],  # a chunk continuing a cached context
    "mixed": [(40, 1), (0, MIN_CHUNK + 5), (9, 1), (50, 7), (300, MIN_CHUNK), (17, 45)],
}


# head_dim 64 and 128 take the C++ kernel (where built), 32 the blocked matmuls.
@pytest.mark.parametrize("dim, heads, kv_heads", [(64, 9, 3), (64, 4, 4), (64, 10, 2), (128, 8, 2),
                                                  (32, 4, 2)])
@pytest.mark.parametrize("case", sorted(LONG_SPANS))
def test_long_bf16_prefill_matches_reference(dim, heads, kv_heads, case):
    q, k, v, k_cache, v_cache, meta = random_batch(
        hash((case, heads)) % 1000, LONG_SPANS[case], heads, kv_heads, dim, 16, torch.bfloat16)
    scale = dim ** -0.5
    ref_k, ref_v = k_cache.float(), v_cache.float()
    expected = paged_attention(q.float(), k.float(), v.float(), ref_k, ref_v, meta, scale)
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    got = paged_attention_cpu(KERNELS, q.contiguous(), k, v, k_cache, v_cache, meta, scale)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, ctx, block", [(23, 23, 7), (23, 61, 7), (5, 5, 8), (40, 40, 40),
                                           (1, 9, 4), (100, 133, 16)])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4), (6, 1)])
def test_blocked_causal_attention_matches_sdpa(dtype, n, ctx, block, heads, kv_heads):
    """Small blocks: several blocks, a partial last one, queries offset over earlier keys."""
    gen = torch.Generator().manual_seed(n * ctx + block)
    q = torch.randn(n, heads, 64, generator=gen)
    keys = torch.randn(ctx, kv_heads, 64, generator=gen)
    values = torch.randn(ctx, kv_heads, 64, generator=gen)
    q_pos = torch.arange(ctx - n, ctx)
    mask = torch.arange(ctx)[None, :] <= q_pos[:, None]
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=mask, scale=0.125, enable_gqa=True)[0].transpose(0, 1)
    got = blocked_causal_attention(q.to(dtype), keys.to(dtype), values.to(dtype), 0.125, block)
    assert got.dtype == dtype and got.shape == q.shape
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected, atol=atol, rtol=rtol)


# The C++ causal prefill kernel (kernels/prefill_attention.cpp) against an fp32 reference.
needs_prefill_kernel = pytest.mark.skipif(
    prefill_kernel(torch.zeros(1, 1, 64, dtype=torch.bfloat16), KERNELS) is None,
    reason="prefill kernel not built (no AVX512-BF16)")


@needs_prefill_kernel
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4), (8, 2), (6, 1)])  # groups 3, 1, 4, 6
@pytest.mark.parametrize("n, ctx", [(1, 1), (1, 40), (5, 5), (23, 61), (100, 133), (257, 257),
                                    (64, 700), (300, 811)])
def test_prefill_kernel_matches_fp32_reference(dim, heads, kv_heads, n, ctx):
    """Whole prompts (n == ctx) and chunks continuing a context (n < ctx), lengths on and off the
    kernel's 12-row tiles and 64-key blocks; the paged form (block table) gives the same bits."""
    gen = torch.Generator().manual_seed(n * 1000 + ctx + dim + heads)
    q = torch.randn(n, heads, dim, generator=gen).bfloat16()
    keys = torch.randn(ctx, kv_heads, dim, generator=gen).bfloat16()
    values = torch.randn(ctx, kv_heads, dim, generator=gen).bfloat16()
    scale = dim ** -0.5
    got = KERNELS.prefill_attention(q, keys, values, scale, None, -1)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), offset_causal_sdpa(q, keys, values, scale),
                               atol=2e-2, rtol=2e-2)
    k_cache, table = scatter_to_cache(keys, 16, gen)
    v_cache = torch.randn(k_cache.shape, generator=gen).bfloat16()
    v_cache.view(-1, kv_heads, dim)[cache_slots(table, 16, ctx)] = values
    paged = KERNELS.prefill_attention(q, k_cache, v_cache, scale, table, ctx)
    assert torch.equal(paged, got)


@needs_prefill_kernel
def test_prefill_kernel_strided_inputs_and_threads():
    """q, k, v as views of one fused qkv projection (the model's layout) give the bits of
    contiguous copies, with one thread or two (each work item is computed by one thread)."""
    gen = torch.Generator().manual_seed(7)
    n, heads, kv_heads, dim = 333, 9, 3, 64
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).bfloat16()
    q = qkv[:, :heads * dim].view(n, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(n, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(n, kv_heads, dim)
    expected = KERNELS.prefill_attention(q.contiguous(), k.contiguous(), v.contiguous(), 0.125,
                                         None, -1)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(KERNELS.prefill_attention(q, k, v, 0.125, None, -1), expected)
    finally:
        torch.set_num_threads(before)


@needs_prefill_kernel
@pytest.mark.parametrize("n, ctx", [(200, 200), (130, 900)])
def test_prefill_kernel_peaked_and_growing_scores(n, ctx):
    """Large scores whose maximum keeps growing along the keys: the online softmax's running
    max moves (rescaling the partial sums) many times, and the weights are near one-hot."""
    gen = torch.Generator().manual_seed(n)
    heads, kv_heads, dim = 6, 2, 64
    direction = torch.randn(dim, generator=gen)
    q = (torch.randn(n, heads, dim, generator=gen) + 3 * direction).bfloat16()
    growth = torch.linspace(0.1, 4.0, ctx)[:, None, None]
    keys = (growth * (torch.randn(ctx, kv_heads, dim, generator=gen) + direction)).bfloat16()
    values = torch.randn(ctx, kv_heads, dim, generator=gen).bfloat16()
    got = KERNELS.prefill_attention(q, keys, values, 0.125, None, -1)
    expected = offset_causal_sdpa(q, keys, values, 0.125)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)


def test_causal_prefill_attention_falls_back_without_kernel():
    """No kernels (or a head_dim the kernel does not serve): the blocked matmuls, same result."""
    gen = torch.Generator().manual_seed(3)
    for dim in (64, 48):
        q = torch.randn(40, 4, dim, generator=gen).bfloat16()
        keys = torch.randn(70, 2, dim, generator=gen).bfloat16()
        values = torch.randn(70, 2, dim, generator=gen).bfloat16()
        expected = blocked_causal_attention(q, keys, values, 0.25)
        assert torch.equal(causal_prefill_attention(q, keys, values, 0.25, None), expected)
        if dim == 48:
            assert prefill_kernel(q, KERNELS) is None
            assert torch.equal(causal_prefill_attention(q, keys, values, 0.25, KERNELS), expected)


@needs_prefill_kernel
def test_prefill_kernel_rejects_bad_input():
    cases = bad_prefill_attention_calls(torch.bfloat16)
    for match, args in cases:
        with pytest.raises(RuntimeError, match=match):
            KERNELS.prefill_attention(*args)


@pytest.mark.parametrize("rows, vocab", [(1, 5), (3, 17), (64, 49152), (2, 16)])
def test_argmax_rows_matches_torch(rows, vocab):
    """Greedy sampling's kernel: torch.argmax(-1) semantics (first maximum; NaN wins)."""
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=gen)
    logits[0, vocab // 2] = logits[0].max() + 1  # a tie: the first index wins
    logits[0, vocab - 1] = logits[0, vocab // 2]
    if rows > 1:
        logits[1] = float("-inf")
        logits[1, vocab - 1] = float("nan")
    if rows > 2:
        logits[2, :] = 0.5  # all equal
    assert torch.equal(KERNELS.argmax_rows(logits), logits.argmax(-1))
    with pytest.raises(RuntimeError, match="float32"):
        KERNELS.argmax_rows(logits.bfloat16())
