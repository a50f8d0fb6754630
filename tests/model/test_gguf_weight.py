"""GGUFWeight: every supported GGUF type computed from its own blocks, against gguf-py's reference
dequantization of the same blocks, on the kernel tier that runs (the Makefile runs this file a
second time with CADENCE_ISA=avx2 on AVX-512 CPUs) and on the torch path.

Weights come from gguf.quants.quantize where gguf-py quantizes the type, else from random valid
blocks (finite fp16 scales, random quant bytes: every bit pattern of the quants is valid). Shapes
have an odd N and, for the 32-weight block types, a K that is not a multiple of 256."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf import quants as gguf_quants

from cadence.model.gguf_weight import SUPPORTED_TYPES, GGUFWeight
from cadence.model.kernels.cpu_ops import load_cpu_kernels

Q = GGMLQuantizationType
KERNELS = load_cpu_kernels()
TIER = KERNELS.kernel_tier() if KERNELS is not None else "torch"
QUANTIZED_BY_GGUF = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
# Byte offsets of the fp16 scales in each block (the rest of a block is quant bytes / 6-bit
# scales, any value valid).
HALF_OFFSETS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,),
                Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.IQ4_XS: (0,)}
N_ROWS = 37


def k_for(qtype: GGMLQuantizationType) -> int:
    block = GGML_QUANT_SIZES[qtype][0]
    if block == 1:
        return 203  # the float types take any K: tails of every vector width
    return 512 if block == 256 else 352  # 352 = 11 blocks of 32, not a multiple of 256


def random_blocks(qtype: GGMLQuantizationType, N: int, K: int, seed: int) -> np.ndarray:
    """[N, row bytes] uint8 of valid random blocks: random bytes with finite fp16 scales."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(N, K // block, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype]:
        scale = (rng.uniform(0.002, 0.02, size=(N, K // block)) * rng.choice([-1, 1], size=(N, K // block)))
        data[:, :, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(N, K // block, 2)
    return data.reshape(N, -1)


def make_weight(qtype: GGMLQuantizationType, seed: int = 0, random: bool = False) -> GGUFWeight:
    K = k_for(qtype)
    if random or qtype not in QUANTIZED_BY_GGUF + FLOAT_TYPES:
        return GGUFWeight.from_data(qtype, (N_ROWS, K), random_blocks(qtype, N_ROWS, K, seed))
    w = torch.randn(N_ROWS, K, generator=torch.Generator().manual_seed(seed)) * 0.05
    return GGUFWeight.quantize(w, qtype)


CASES = [(t, False) for t in SUPPORTED_TYPES] + [(Q.Q8_0, True), (Q.Q4_0, True), (Q.Q5_1, True)]
CASE_IDS = [f"{t.name}-{'random' if r else 'auto'}" for t, r in CASES]


def activations_seen(x: torch.Tensor, qtype) -> torch.Tensor:
    """What the integer kernels multiply: x quantized per row to int8 with amax / 127 scales,
    one scale per 32 k (llama.cpp's q8_0), or per 256 k for the 256-weight types (the K-quants
    and IQ4_XS: its q8_K)."""
    if GGML_QUANT_SIZES[qtype][0] != 256:
        return KERNELS.quantize_activations_q8(x).double()
    spans = x.float().reshape(x.shape[0], -1, 256)
    amax = spans.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)  # float32, as the kernel
    q = torch.round(spans * inv)  # half to even, as the kernel
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def reference_dequantize(weight: GGUFWeight) -> torch.Tensor:
    return torch.from_numpy(np.array(gguf_quants.dequantize(weight.blocks.numpy(), weight.ggml_type)))


@pytest.mark.parametrize(("qtype", "random"), CASES, ids=CASE_IDS)
def test_dequantize_and_embedding_are_gguf_exact(qtype, random):
    weight = make_weight(qtype, seed=1, random=random)
    reference = reference_dequantize(weight).reshape(weight.shape)
    assert torch.equal(weight.dequantize(), reference)
    ids = torch.tensor([5, 0, 36, 5])
    assert torch.equal(weight.embedding(ids), reference[ids])
    # Every row (Q4_K, Q6_K, Q8_0 decode them in the kernels: gguf-py's float32 roundings, no FMA).
    assert torch.equal(weight.embedding(torch.arange(N_ROWS)), reference)
    assert weight.blocks.numel() == N_ROWS * weight.blocks.shape[1]
    if weight.packed is None:
        assert weight.nbytes == weight.blocks.numel()


@pytest.mark.parametrize(("qtype", "random"), CASES, ids=CASE_IDS)
def test_linear_matches_reference_dequantization(qtype, random):
    weight = make_weight(qtype, seed=2, random=random)
    N, K = weight.shape
    w_ref = reference_dequantize(weight).reshape(N, K).double()
    gen = torch.Generator().manual_seed(3)
    bias = torch.randn(N, generator=gen)
    for T in (1, 3, 17, 64):
        x = torch.randn(T, K, generator=gen)
        y = weight.linear(x, bias if T == 3 else None)
        expected_bias = bias.double() if T == 3 else 0.0
        assert y.shape == (T, N) and y.dtype == torch.float32
        if T > 1:  # batch-invariant: each row as it comes out alone
            torch.testing.assert_close(y[1:2], weight.linear(x[1:2], bias if T == 3 else None), rtol=0, atol=0)
        exact = (x.double() @ w_ref.T + expected_bias)
        scale = float(exact.abs().max())
        if qtype in FLOAT_TYPES:
            if qtype == Q.BF16 and TIER == "avx512bf16":
                # bf16 dot products: x is rounded to bf16, then exact products with float32 sums.
                seen = x.to(torch.bfloat16).double()
                torch.testing.assert_close(y.double(), seen @ w_ref.T + expected_bias, rtol=0, atol=1e-5 * scale)
            else:
                torch.testing.assert_close(y.double(), exact, rtol=0, atol=1e-5 * scale)
            continue
        # What the integer kernels multiply: x quantized per row and 32 k (int8, amax / 127).
        if KERNELS is not None:
            x_q = activations_seen(x, qtype)
            torch.testing.assert_close(y.double(), x_q @ w_ref.T + expected_bias, rtol=0, atol=2e-5 * scale)
            # Against float activations: 8-bit activations' error (~0.6% of the output's norm).
            assert float((y.double() - exact).norm() / exact.norm()) < 0.015
        else:
            torch.testing.assert_close(y.double(), exact, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.BF16, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.IQ4_XS])
def test_torch_path_matches_reference(qtype):
    """The path without compiled kernels dequantizes slabs of rows and uses F.linear."""
    weight = make_weight(qtype, seed=4)
    x = torch.randn(5, weight.in_features, generator=torch.Generator().manual_seed(5))
    expected = x @ reference_dequantize(weight).reshape(weight.shape).T
    torch.testing.assert_close(weight._torch_linear(x, None), expected, rtol=1e-5, atol=1e-5)


def test_leading_dimensions_and_take_rows():
    weight = make_weight(Q.Q4_K, seed=6)
    x = torch.randn(2, 3, weight.in_features, generator=torch.Generator().manual_seed(7))
    y = weight.linear(x)
    assert y.shape == (2, 3, N_ROWS)
    torch.testing.assert_close(y.reshape(6, -1), weight.linear(x.reshape(6, -1)), rtol=0, atol=0)
    order = torch.tensor([3, 1, 36, 0])
    picked = weight.take_rows(order)
    assert picked.shape == (4, weight.in_features) and picked.ggml_type == Q.Q4_K
    assert torch.equal(picked.dequantize(), weight.dequantize()[order])
    # 4 rows: no whole octet to repack, so the row-wise kernel (another summation order).
    assert picked.packed is None and weight.packed is not None
    torch.testing.assert_close(picked.linear(x.reshape(6, -1)), y.reshape(6, -1)[:, order], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [1, 6])
def test_linear_many_is_each_linear_side_by_side(T):
    """Several weights of one input (a layer's q/k/v: Q4_K, Q4_K, Q6_K; and a mix of per-32 and
    per-256 quantized, float and row-wise types) in one call give exactly each weight's own
    linear, concatenated: same bits, whatever the thread split over the weights."""
    gen = torch.Generator().manual_seed(13)
    q = GGUFWeight.from_data(Q.Q4_K, (64, 512), random_blocks(Q.Q4_K, 64, 512, seed=14))
    k = GGUFWeight.from_data(Q.Q4_K, (16, 512), random_blocks(Q.Q4_K, 16, 512, seed=15))
    v = GGUFWeight.from_data(Q.Q6_K, (21, 512), random_blocks(Q.Q6_K, 21, 512, seed=16))  # 2 octets + 5 row-wise
    others = [GGUFWeight.from_data(Q.Q8_0, (9, 512), random_blocks(Q.Q8_0, 9, 512, seed=17)),
              GGUFWeight.quantize(torch.randn(5, 512, generator=gen), Q.F16)]
    x = torch.randn(T, 512, generator=gen)
    bias = torch.randn(16, generator=gen)
    for weights, biases in (([q, k, v], [None, bias, None]), ([v, *others, q], None)):
        together = GGUFWeight.linear_many(weights, x, biases)
        alone = torch.cat([w.linear(x, None if biases is None else biases[i]) for i, w in enumerate(weights)], dim=-1)
        assert together.shape == (T, sum(w.shape[0] for w in weights))
        torch.testing.assert_close(together, alone, rtol=0, atol=0)
    with pytest.raises(ValueError, match="features"):
        GGUFWeight.linear_many([q, GGUFWeight.from_data(Q.Q8_0, (4, 256), random_blocks(Q.Q8_0, 4, 256, seed=1))], x)


@pytest.mark.skipif(KERNELS is None, reason="the repack is a compiled kernel")
@pytest.mark.parametrize(("qtype", "octet_block"), [(Q.Q3_K, 928), (Q.Q4_K, 1152), (Q.Q5_K, 1408), (Q.Q6_K, 1696)])
def test_k_quant_repacked_octets_match_row_wise_blocks(qtype, octet_block):
    """Q3_K's, Q4_K's, Q5_K's and Q6_K's octets of columns repacked (8 interleaved) compute what the
    row-wise blocks give."""
    weight = make_weight(qtype, seed=11)
    N, K = weight.shape
    assert weight.packed is not None and tuple(weight.packed.shape) == (N // 8, K // 256 * octet_block)
    assert weight.nbytes == weight.packed.numel() + (N % 8) * weight.blocks.shape[1]
    for T in (1, 5):
        x = torch.randn(T, K, generator=torch.Generator().manual_seed(12))
        row_wise = KERNELS.gguf_linear(x, weight.blocks, int(qtype), N, K, None, None)
        torch.testing.assert_close(weight.linear(x), row_wise, rtol=1e-5, atol=1e-5 * float(row_wise.abs().max()))


@pytest.mark.parametrize("qtype", [Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quant_octets_same_bits_alone_or_paired(qtype):
    """The AVX-512 tiers run repacked octets in pairs (16 columns per register), a lone octet on
    the 256-bit tile: a column's result is the same bits either way, for one row or several."""
    pair = GGUFWeight.from_data(qtype, (16, 512), random_blocks(qtype, 16, 512, seed=20))
    lone = pair.take_rows(torch.arange(8, 16))
    three = GGUFWeight.from_data(qtype, (24, 512), random_blocks(qtype, 24, 512, seed=21))
    for T in (1, 5):
        x = torch.randn(T, 512, generator=torch.Generator().manual_seed(22))
        torch.testing.assert_close(pair.linear(x)[:, 8:], lone.linear(x), rtol=0, atol=0)
        torch.testing.assert_close(three.linear(x)[:, :8], three.take_rows(torch.arange(8)).linear(x),
                                   rtol=0, atol=0)


def extreme_k_quant_blocks(qtype: GGMLQuantizationType, N: int, K: int, scale_byte: int) -> np.ndarray:
    """[N, row bytes] of blocks whose every quant is the largest (Q3_K 7, Q4_K 15, Q5_K 31, Q6_K 63)
    and every 6-bit / int8 scale byte `scale_byte`: the integer sums' worst case."""
    block, size = GGML_QUANT_SIZES[qtype]
    data = np.full((N, K // block, size), 0xFF, dtype=np.uint8)
    half = np.array([0.01], dtype=np.float16).view(np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin, 12 bytes of scales/minimums, (Q5_K: 32 of fifth bits,) nibbles
        data[:, :, 0:2] = half
        data[:, :, 2:4] = half
        data[:, :, 4:16] = scale_byte
    elif qtype == Q.Q3_K:  # 32 hmask, 64 qs, 12 bytes of 6-bit scales (0xFF: all 31, 0x00: all -32), d
        data[:, :, 96:108] = scale_byte
        data[:, :, 108:110] = half
    else:  # Q6_K: 128 ql, 64 qh, 16 int8 scales, d
        data[:, :, 192:208] = scale_byte
        data[:, :, 208:210] = half
    return data.reshape(N, -1)


@pytest.mark.parametrize(("qtype", "scale_byte"), [(Q.Q3_K, 0xFF), (Q.Q3_K, 0x00), (Q.Q4_K, 0xFF), (Q.Q5_K, 0xFF),
                                                  (Q.Q6_K, 0x7F), (Q.Q6_K, 0x80)])
def test_k_quant_integer_sums_exact_at_the_extremes(qtype, scale_byte):
    """The AVX2 tiles add maddubs' pair sums in int16 and apply the scales in integers: with every
    quant at its maximum, every scale at its extreme and every activation at +-127 (after
    quantization) the sums reach their bounds (Q3_K 14224 per 16 k, Q4_K 30480 per int16 lane, Q5_K 31496,
    Q6_K 32004) and must
    not wrap: the result is the reference's, for one row and a tile of several."""
    N, K = 16, 512
    weight = GGUFWeight.from_data(qtype, (N, K), extreme_k_quant_blocks(qtype, N, K, scale_byte))
    w_ref = reference_dequantize(weight).reshape(N, K).double()
    signs = torch.ones(6, K)
    signs[1] = -1.0
    signs[2, ::2] = -1.0  # alternating signs within a group
    signs[3, K // 2:] = -1.0
    signs[4:] *= torch.linspace(0.5, 1.0, K)  # the amax of each 256 still at +-127
    for T in (1, 6):
        x = signs[:T] if T > 1 else signs[1:2]
        y = weight.linear(x).double()
        expected = activations_seen(x, qtype) @ w_ref.T if KERNELS is not None else x.double() @ w_ref.T
        scale = float(expected.abs().max())
        torch.testing.assert_close(y, expected, rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize("qtype", [Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quant_decode_row_same_bits_as_in_a_batch(qtype):
    """A decode row (M = 1) runs repacked octets eight (Q4_K, both widths; Q5_K on AVX-512), four
    (Q3_K and Q6_K, AVX2 Q5_K), two or one at a time,
    a batch in row tiles: a column's result is the same bits in every case (15 octets: an eight,
    a quad, a pair, a lone one; and column ranges that put each octet in another group)."""
    weight = GGUFWeight.from_data(qtype, (120, 512), random_blocks(qtype, 120, 512, seed=23))
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(24))
    row = weight.linear(x[:1])
    torch.testing.assert_close(row, weight.linear(x)[:1], rtol=0, atol=0)
    for cols in (range(0, 16), range(32, 48), range(48, 56), range(8, 40), range(64, 96), range(104, 120),
                 range(8, 72), range(56, 120)):
        index = torch.tensor(list(cols))
        torch.testing.assert_close(row[:, index], weight.take_rows(index).linear(x[:1]), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
@pytest.mark.parametrize("threads", [1, 2])
def test_k_quant_decode_row_with_many_tiles_same_bits(qtype, threads):
    """A decode row over many octets per thread: each GEMV tile prefetches the thread's next one
    (GemvPrefetch, every K-quant: first tile, middle tiles, last tile, then pairs and a lone octet
    and row-wise columns); a column's result is the bits of the batch's row tiles and of the column
    alone."""
    # 53 octets (tiles of eight: six, then a quad or pairs, a lone one; tiles of four: thirteen, a
    # lone one) + 3 row-wise columns
    N = 8 * 53 + 3
    weight = GGUFWeight.from_data(qtype, (N, 512), random_blocks(qtype, N, 512, seed=31))
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(32))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        row = weight.linear(x[:1])
        torch.testing.assert_close(row, weight.linear(x)[:1], rtol=0, atol=0)
        index = torch.arange(200, 360)
        torch.testing.assert_close(row[:, index], weight.take_rows(index).linear(x[:1]), rtol=0, atol=0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(KERNELS is None, reason="needs the compiled kernels")
def test_large_repacked_copy_sits_on_whole_huge_pages():
    """A repacked copy that rounds up to whole 2 MiB pages with little waste (here 4.15 MB -> 4 MiB)
    gets memory of its own, 2 MiB-aligned (kernels/huge_pages.h), and computes what the row-wise
    blocks compute."""
    N, K = 3600, 2048
    weight = GGUFWeight.from_data(Q.Q4_K, (N, K), random_blocks(Q.Q4_K, N, K, seed=25))
    assert weight.packed.data_ptr() % (2 << 20) == 0
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(26))
    row_wise = KERNELS.gguf_linear(x, weight.blocks, int(Q.Q4_K), N, K, None, None)
    torch.testing.assert_close(weight.linear(x), row_wise, rtol=1e-5, atol=1e-5 * float(row_wise.abs().max()))
    torch.testing.assert_close(weight.linear(x[:1]), weight.linear(x)[:1], rtol=0, atol=0)
    del weight  # the copy's memory is unmapped with it


@pytest.mark.skipif(KERNELS is None, reason="needs the compiled kernels")
def test_small_repacked_copies_share_huge_page_chunks():
    """Repacked copies that would waste over an eighth of whole 2 MiB pages of their own (a 1B
    model's q and k: 2.36 and 0.59 MB) are carved one after the other from a shared chunk of huge
    pages (huge_pages.h HugePageArena), each 64-byte aligned; each computes what its row-wise
    blocks compute, also after the other one is freed (a chunk lives while any copy of it does)."""
    K = 2048
    q = GGUFWeight.from_data(Q.Q4_K, (2048, K), random_blocks(Q.Q4_K, 2048, K, seed=27))
    k = GGUFWeight.from_data(Q.Q6_K, (512, K), random_blocks(Q.Q6_K, 512, K, seed=28))
    first, second = q.packed.data_ptr(), k.packed.data_ptr()
    assert first % 64 == 0 and second % 64 == 0
    # The next slice of the same chunk, or (the chunk full) the start of a new 2 MiB-aligned one.
    assert second == first + (q.packed.numel() + 63) // 64 * 64 or second % (2 << 20) == 0
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(29))
    expected = KERNELS.gguf_linear(x, k.blocks, int(Q.Q6_K), 512, K, None, None)
    del q
    torch.testing.assert_close(k.linear(x), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    torch.testing.assert_close(k.linear(x[:1]), k.linear(x)[:1], rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [Q.IQ2_XXS, Q.IQ3_S, Q.TQ1_0, Q.Q8_1])
def test_unsupported_types_raise_naming_the_type(qtype):
    with pytest.raises(ValueError, match=rf"{qtype.name} is not supported.*Q4_K.*Q6_K"):
        GGUFWeight.from_data(qtype, (4, 256), np.zeros(4 * GGML_QUANT_SIZES[qtype][1], dtype=np.uint8))


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="not a whole number"):
        GGUFWeight.from_data(Q.Q4_K, (2, 288), np.zeros(2 * 144, dtype=np.uint8))
    weight = make_weight(Q.Q8_0)
    with pytest.raises(ValueError, match="features"):
        weight.linear(torch.zeros(1, weight.in_features + 32))


def test_memory_mapped_file_is_used_in_place(tmp_path):
    """A GGUF file's tensors are computed on in its memory map: no copy of the blocks."""
    path = tmp_path / "w.gguf"
    q4k = random_blocks(Q.Q4_K, 64, 512, seed=8)
    q8 = gguf_quants.quantize(np.random.default_rng(9).standard_normal((48, 256)).astype(np.float32), Q.Q8_0)
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("a.weight", q4k, raw_dtype=Q.Q4_K)
    writer.add_tensor("b.weight", q8, raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = GGUFReader(str(path))
    start = reader.data.ctypes.data
    end = start + reader.data.nbytes
    tensors = {t.name: t for t in reader.tensors}
    for name, raw, qtype, shape in (("a.weight", q4k, Q.Q4_K, (64, 512)), ("b.weight", q8, Q.Q8_0, (48, 256))):
        weight = GGUFWeight.from_reader_tensor(tensors[name])
        assert weight.ggml_type == qtype and weight.shape == shape
        assert start <= weight.blocks.data_ptr() and weight.blocks.data_ptr() + weight.nbytes <= end
        copy = GGUFWeight.from_data(qtype, shape, np.array(raw))
        x = torch.randn(2, shape[1])
        torch.testing.assert_close(weight.linear(x), copy.linear(x), rtol=0, atol=0)


def test_rows_of_a_file_tensor_read_in_place(tmp_path):
    """from_reader_tensor(rows=...): a weight of some rows of a file tensor in another order (the
    q/k permutation, a fused tensor's part). With every column repacked it keeps the file's
    blocks in place (no copy of the rows) and computes, dequantizes and looks up exactly what a
    copy of those rows gives; otherwise it is that copy."""
    path = tmp_path / "w.gguf"
    raw = random_blocks(Q.Q4_K, 64, 512, seed=18)
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("a.weight", raw, raw_dtype=Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = GGUFReader(str(path))
    tensor = reader.tensors[0]
    full = GGUFWeight.from_data(Q.Q4_K, (64, 512), np.array(raw))
    gen = torch.Generator().manual_seed(19)
    x = torch.randn(3, 512, generator=gen)
    for order in (torch.randperm(64, generator=gen), torch.randperm(64, generator=gen)[:16], torch.arange(5, 17)):
        weight = GGUFWeight.from_reader_tensor(tensor, order)
        copy = full.take_rows(order)
        assert weight.shape == (order.numel(), 512)
        in_place = KERNELS is not None and order.numel() % 8 == 0
        assert (weight.row_order is not None) == in_place
        if in_place:
            start = reader.data.ctypes.data
            assert start <= weight.blocks.data_ptr() < start + reader.data.nbytes
            assert weight.nbytes == weight.packed.numel()
        assert torch.equal(weight.dequantize(), copy.dequantize())
        assert torch.equal(weight.embedding(torch.tensor([3, 0, 3])), copy.embedding(torch.tensor([3, 0, 3])))
        torch.testing.assert_close(weight.linear(x), copy.linear(x), rtol=0, atol=0)
        torch.testing.assert_close(GGUFWeight.linear_many([weight, full], x),
                                   torch.cat([copy.linear(x), full.linear(x)], dim=-1), rtol=0, atol=0)
        assert torch.equal(weight.take_rows(torch.tensor([2, 1])).dequantize(), copy.dequantize()[[2, 1]])
        torch.testing.assert_close(weight._torch_linear(x, None), copy._torch_linear(x, None), rtol=0, atol=0)


GEMMA3_FILE = "/work/cache/gemma/gemma-3-270m-q4_k_m.gguf"


@pytest.mark.slow  # gguf-py parses the 262144-token vocabulary: ~15 s
@pytest.mark.skipif(not os.path.isfile(GEMMA3_FILE), reason=f"{GEMMA3_FILE} is only on the development machine")
def test_real_q4_k_m_file_each_type_in_place():
    """A published Q4_K_M file (Q5_0, Q4_K, Q6_K, Q8_0 tensors, a 262144 x 640 Q8_0 vocabulary):
    each type's first tensor computed in the memory map against gguf-py's dequantization."""
    reader = GGUFReader(GEMMA3_FILE)
    first: dict[GGMLQuantizationType, object] = {}
    for tensor in reader.tensors:
        if len(tensor.shape) == 2 and tensor.name != "token_embd.weight":
            first.setdefault(tensor.tensor_type, tensor)
    assert {Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.Q8_0} <= set(first)
    gen = torch.Generator().manual_seed(10)
    for qtype, tensor in first.items():
        weight = GGUFWeight.from_reader_tensor(tensor)
        assert weight.ggml_type == qtype
        x = torch.randn(3, weight.in_features, generator=gen)
        w_ref = reference_dequantize(weight).reshape(weight.shape).double()
        seen = activations_seen(x, qtype) if KERNELS is not None else x.double()
        expected = seen @ w_ref.T
        torch.testing.assert_close(weight.linear(x).double(), expected, rtol=0, atol=2e-5 * float(expected.abs().max()))
    vocab = GGUFWeight.from_reader_tensor(next(t for t in reader.tensors if t.name == "token_embd.weight"))
    assert vocab.shape == (262144, 640) and vocab.ggml_type == Q.Q8_0
    ids = torch.tensor([2, 262143, 1000])
    rows = gguf_quants.dequantize(vocab.blocks[ids].numpy(), Q.Q8_0)
    assert torch.equal(vocab.embedding(ids), torch.from_numpy(rows))
