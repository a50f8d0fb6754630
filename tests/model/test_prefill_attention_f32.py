"""The float32 causal prefill kernel (kernels/avx2/prefill_attention_f32.cpp) against a float64
reference: whole prompts and chunks continuing a context, contiguous and paged K/V, lengths on and
off its 24-row tiles and 32-key blocks; bits that do not depend on chunking, strides or threads;
its dispatch from cadence.model.prefill_attention; bad input."""

from __future__ import annotations

import pytest
import torch

from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.prefill_attention import (
    F32_KERNEL_TIERS,
    causal_prefill_attention,
    prefill_kernel,
    takes_blocked,
)

from .paged_helpers import bad_prefill_attention_calls, cache_slots, offset_causal_sdpa, scatter_to_cache

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(
    KERNELS is None or KERNELS.kernel_tier() not in F32_KERNEL_TIERS,
    reason="float32 prefill kernel not built (needs AVX2 + FMA)")


def reference(q, keys, values, scale):
    return offset_causal_sdpa(q, keys, values, scale, torch.float64)


def test_dispatch_picks_the_float32_kernel():
    q = torch.zeros(4, 3, 64)
    assert prefill_kernel(q, KERNELS) == KERNELS.prefill_attention_f32
    assert prefill_kernel(q, None) is None
    assert prefill_kernel(torch.zeros(4, 3, 48), KERNELS) is None  # head_dim it does not serve
    assert takes_blocked(q, 100, 0, KERNELS) and takes_blocked(q, 8, 40, KERNELS)
    assert not takes_blocked(q, 7, 40, KERNELS)  # few rows continuing a context: paged decode rows


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("n, ctx", [(1, 1), (1, 40), (5, 5), (23, 61), (100, 133), (257, 257),
                                    (64, 700), (300, 811)])
def test_matches_float64_reference_contiguous_and_paged(dim, heads, kv_heads, n, ctx):
    gen = torch.Generator().manual_seed(n * 1000 + ctx + dim + heads)
    q = torch.randn(n, heads, dim, generator=gen)
    keys = torch.randn(ctx, kv_heads, dim, generator=gen)
    values = torch.randn(ctx, kv_heads, dim, generator=gen)
    scale = dim ** -0.5
    got = KERNELS.prefill_attention_f32(q, keys, values, scale, None, -1)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), reference(q, keys, values, scale), atol=2e-6, rtol=1e-5)
    k_cache, table = scatter_to_cache(keys, 16, gen)
    v_cache = torch.randn(k_cache.shape, generator=gen)
    v_cache.view(-1, kv_heads, dim)[cache_slots(table, 16, ctx)] = values
    assert torch.equal(KERNELS.prefill_attention_f32(q, k_cache, v_cache, scale, table, ctx), got)


def test_rows_do_not_depend_on_chunking():
    """A prompt computed whole, or as chunks each over the cached context before it, gives the
    same bits for every row (a row's sums never depend on which rows share its tile)."""
    gen = torch.Generator().manual_seed(11)
    ctx, heads, kv_heads, dim = 517, 9, 3, 64
    q = torch.randn(ctx, heads, dim, generator=gen)
    keys = torch.randn(ctx, kv_heads, dim, generator=gen)
    values = torch.randn(ctx, kv_heads, dim, generator=gen)
    whole = KERNELS.prefill_attention_f32(q, keys, values, 0.125, None, -1)
    k_cache, table = scatter_to_cache(keys, 16, gen)
    v_cache = torch.zeros_like(k_cache)
    v_cache.view(-1, kv_heads, dim)[cache_slots(table, 16, ctx)] = values
    for start, end in [(0, 1), (1, 40), (40, 64), (64, 300), (300, 517)]:
        chunk = KERNELS.prefill_attention_f32(q[start:end], k_cache, v_cache, 0.125, table, end)
        assert torch.equal(chunk, whole[start:end]), (start, end)


def test_strided_inputs_and_threads_give_the_same_bits():
    """q, k, v as views of one fused qkv projection (the model's layout) give the bits of
    contiguous copies, with one thread or two."""
    gen = torch.Generator().manual_seed(7)
    n, heads, kv_heads, dim = 333, 9, 3, 64
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv[:, :heads * dim].view(n, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(n, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(n, kv_heads, dim)
    expected = KERNELS.prefill_attention_f32(q.contiguous(), k.contiguous(), v.contiguous(), 0.125, None, -1)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(KERNELS.prefill_attention_f32(q, k, v, 0.125, None, -1), expected)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(causal_prefill_attention(q, k, v, 0.125, KERNELS), expected)


@pytest.mark.parametrize("n, ctx", [(200, 200), (130, 900)])
def test_peaked_and_growing_scores(n, ctx):
    """Large scores whose maximum keeps growing along the keys (the running max moves and the
    partial sums are rescaled many times; near one-hot weights): no worse than 4x torch's own
    float32 SDPA error against float64."""
    gen = torch.Generator().manual_seed(n)
    heads, kv_heads, dim = 6, 2, 64
    direction = torch.randn(dim, generator=gen)
    q = torch.randn(n, heads, dim, generator=gen) + 3 * direction
    growth = torch.linspace(0.1, 4.0, ctx)[:, None, None]
    keys = growth * (torch.randn(ctx, kv_heads, dim, generator=gen) + direction)
    values = torch.randn(ctx, kv_heads, dim, generator=gen)
    exact = reference(q, keys, values, 0.125)
    got = KERNELS.prefill_attention_f32(q, keys, values, 0.125, None, -1)
    torch_f32 = offset_causal_sdpa(q, keys, values, 0.125)
    assert torch.isfinite(got).all()
    ours = (got.double() - exact).abs().max().item()
    theirs = (torch_f32.double() - exact).abs().max().item()
    assert ours <= 4 * theirs + 1e-6, (ours, theirs)


def test_rejects_bad_input():
    cases = bad_prefill_attention_calls(torch.float32)
    for match, args in cases:
        with pytest.raises(RuntimeError, match=match):
            KERNELS.prefill_attention_f32(*args)
