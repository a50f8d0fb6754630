"""The float32 paged attention kernel gives every query row the same bits whatever else is in
the call (issue 31: batch-invariant greedy results by default).

Prompt chunks run as tiles of consecutive rows (attend_rows_span_f32), decodes one row at a time
(attend_span_f32); a row's result must not depend on which of the two computed it, on its tile
mates, on the other sequences of the step or on the thread count. Compared bit for bit against
each row computed alone (a batch of one decode row).
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.prefill_attention import F32_KERNEL_TIERS

HQ, HKV, BLOCK = 9, 3, 16


@pytest.fixture(scope="module")
def kernels():
    k = load_cpu_kernels()
    if k is None or k.kernel_tier() not in F32_KERNEL_TIERS:
        pytest.skip("no float32 kernel tier on this CPU")
    return k


def _alone(kernels, q, kc, vc, tables, seq, lens, scale):
    """Each row as a step of its own (one decode row)."""
    return torch.cat([kernels.paged_attention(q[i:i + 1].contiguous(), kc, vc, tables, seq[i:i + 1],
                                              lens[i:i + 1], scale) for i in range(q.shape[0])])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rows_are_bit_identical_to_each_row_alone(kernels, head_dim):
    gen = torch.Generator().manual_seed(31)
    # Sequence 0: a prompt chunk of 300 rows from position 5 (tiles cross span 256);
    # sequence 1: a chunk of 40 rows from 600; sequence 2 and 3: decode rows.
    chunks = [(5, 300), (600, 40), (700, 1), (17, 1)]
    max_blocks = 48
    num_blocks = max_blocks * len(chunks)
    kc = torch.randn(num_blocks, BLOCK, HKV, head_dim, generator=gen)
    vc = torch.randn(num_blocks, BLOCK, HKV, head_dim, generator=gen)
    # Scattered, non-contiguous block tables.
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = perm.view(len(chunks), max_blocks).contiguous()
    seq = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, (_, n) in enumerate(chunks)])
    lens = torch.cat([torch.arange(start + 1, start + n + 1) for start, n in chunks])
    q = torch.randn(seq.numel(), HQ, head_dim, generator=gen)
    scale = head_dim ** -0.5
    together = kernels.paged_attention(q, kc, vc, tables, seq, lens, scale)
    alone = _alone(kernels, q, kc, vc, tables, seq, lens, scale)
    assert torch.equal(together, alone)
    # Other tiles of the same rows: a decode row between rows 122 and 123 cuts the chunk there.
    order = torch.cat([torch.tensor([340]), torch.arange(0, 123), torch.tensor([341]), torch.arange(123, 340)])
    reordered = kernels.paged_attention(q[order].contiguous(), kc, vc, tables, seq[order], lens[order], scale)
    assert torch.equal(reordered, together[order])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = kernels.paged_attention(q, kc, vc, tables, seq, lens, scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, together)
    # And close to plain float64 attention (the kernel is right, not only consistent).
    for i in (0, 150, 299, 300, 341):
        s, n = int(seq[i]), int(lens[i])
        blocks = tables[s, : -(-n // BLOCK)].long()
        keys = kc[blocks].flatten(0, 1)[:n].double()  # [n, Hkv, D]
        vals = vc[blocks].flatten(0, 1)[:n].double()
        qi = q[i].double().view(HKV, HQ // HKV, head_dim)
        w = torch.softmax(torch.einsum("hgd,nhd->hgn", qi, keys) * scale, dim=-1)
        ref = torch.einsum("hgn,nhd->hgd", w, vals).reshape(HQ, head_dim)
        torch.testing.assert_close(together[i].double(), ref, atol=1e-5, rtol=1e-5)
