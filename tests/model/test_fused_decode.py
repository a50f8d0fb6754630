"""The fused CPU decode stack (kernels.DecodeStack) and the packed bf16 GEMM under it.

The stack runs every layer of a small bf16 step in one C++ call; here it is checked against the
per-op fast path and the fp32 reference on tiny head_dim-64 Llama, Qwen2 (bias) and Qwen3 (q/k
norms) checkpoints: decodes and short prefill chunks over scattered blocks, the KV it writes (the
first layer's with the per-op path's bits), batch and thread-count invariance, and bad input.
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import ENV_SWITCH, STACK_MAX_CHUNK
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from .stack_helpers import check_stack_rejects_bad_kv_addresses, on_one_thread, solo_and_batch_logits

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not KERNELS.has_avx512bf16(),
                                reason="needs the CPU kernels built with AVX512-BF16")

POOL, BLOCK = 64, 4
# Scattered, out-of-order blocks: 16 per sequence (positions up to 64).
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(3)).tolist()
TABLES = [_ORDER[16 * i:16 * (i + 1)] for i in range(3)]


def run_steps(loaded, spans_per_step, stack: bool, monkeypatch):
    """Logits of every step (each a list of (start_pos, n_new) per sequence) and the final cache."""
    monkeypatch.setenv(ENV_SWITCH, "1" if stack else "0")
    model = loaded.model
    model.drop_packed_weights()
    kv = KVCache(loaded.config, POOL, BLOCK, loaded.dtype, "cpu")
    gen = torch.Generator().manual_seed(5)
    logits = []
    with torch.inference_mode():
        for spans in spans_per_step:
            meta = AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, TABLES)], BLOCK, POOL)
            ids = torch.randint(0, loaded.config.vocab_size, (meta.num_tokens,), generator=gen)
            logits.append(model.compute_logits(model(ids, meta.positions, meta, kv)).float())
    return torch.cat(logits), kv.storage.float(), model._decode_stack


# A prefill too long for the stack (per-op path), then decodes and short chunks (the stack).
STEPS = [[(0, 17), (0, 9), (0, 3)], [(17, 1), (9, 1), (3, 1)], [(18, 1), (10, 5), (4, 1)],
         [(19, STACK_MAX_CHUNK - 1), (15, 1), (5, 2)], [(50, 1), (16, 1), (7, 1)]]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_stack_matches_per_op_path_and_fp32_reference(request, arch, monkeypatch):
    path = request.getfixturevalue(f"tiny_{arch}_d64_dir")
    bf16 = load_model(path, dtype=torch.bfloat16, device="cpu")
    fp32 = load_model(path, dtype=torch.float32, device="cpu")
    stack_logits, stack_kv, stack = run_steps(bf16, STEPS, True, monkeypatch)
    assert isinstance(stack, KERNELS.DecodeStack), "the stack should serve this model"
    assert stack.has_qk_norms == bf16.config.qk_norm == (arch == "qwen3")
    per_op_logits, per_op_kv, _ = run_steps(bf16, STEPS, False, monkeypatch)
    # Without a qkv bias the first layer's K and V come from the same bf16 GEMM sums and row
    # functions on both paths ((q/k norms: qk_norm_row,) rope_write_row): the same bits. (Qwen2's
    # bias: the per-op path adds it to the bf16-rounded product, the stack before rounding.) Later
    # layers read attention outputs, whose summation order differs between the paths.
    if arch != "qwen2":
        assert torch.equal(stack_kv[0], per_op_kv[0])
    ref_logits, ref_kv, _ = run_steps(fp32, STEPS, False, monkeypatch)
    # bf16 against fp32: the stack is as close as the per-op bf16 path (both round every op).
    stack_err = (stack_logits - ref_logits).abs().max().item()
    per_op_err = (per_op_logits - ref_logits).abs().max().item()
    assert stack_err <= 1.5 * per_op_err + 0.02, (stack_err, per_op_err)
    torch.testing.assert_close(stack_logits, per_op_logits, atol=0.1, rtol=0.05)
    torch.testing.assert_close(stack_kv, per_op_kv, atol=0.06, rtol=0.05)
    # The cache the stack wrote: as far from fp32's as the per-op path's is (mean error).
    stack_kv_err = (stack_kv - ref_kv).abs().mean().item()
    per_op_kv_err = (per_op_kv - ref_kv).abs().mean().item()
    assert stack_kv_err <= 1.5 * per_op_kv_err + 1e-4, (stack_kv_err, per_op_kv_err)
    assert (stack_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean() >= 0.9


def test_stack_rows_do_not_depend_on_batch_or_threads(tiny_llama_d64_dir, monkeypatch):
    """A decode row gives bit-identical logits alone, in a batch, and on 1 or 2 threads: the
    packed GEMM sums each row in a fixed order and attention runs per row."""
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.bfloat16, device="cpu")
    prefill = [[(0, 20), (0, 11), (0, 6)]]
    steps = prefill + [[(20, 1), (11, 1), (6, 1)]]
    alone = run_steps(loaded, steps, True, monkeypatch)[0]
    assert torch.equal(alone, on_one_thread(lambda: run_steps(loaded, steps, True, monkeypatch)[0]))
    # The first sequence's decode in a step with two other rows vs a step of its own.
    solo, batch = solo_and_batch_logits(loaded.model, loaded.config, loaded.dtype, prefill[0], TABLES, BLOCK, POOL,
                                        monkeypatch)
    assert torch.equal(solo[0], batch[0])


@pytest.mark.parametrize("rows, n, k", [(1, 960, 576), (7, 100, 64), (13, 48, 30), (64, 3072, 128)])
def test_packed_gemm_matches_float_reference(rows, n, k):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(n, k, generator=gen).bfloat16()
    x = torch.randn(rows, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    expected = x.float() @ w.float().t() + bias.float()
    got = KERNELS.linear_packed_bf16(x, KERNELS.pack_linear_bf16(w, False), n, bias).float()
    torch.testing.assert_close(got, expected, atol=2e-2 * expected.abs().max().item(), rtol=1e-2)


@pytest.mark.parametrize("rows, n", [(1, 49152 // 64), (6, 100), (33, 250)])
def test_packed_gemm_float_out_is_the_bf16_result_widened(rows, n):
    # The LM head's logits: float_out must give exactly .float() of the bf16 output (the same
    # rounding), including the masked last block and a bias.
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(n, 96, generator=gen).bfloat16()
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    packed = KERNELS.pack_linear_bf16(w, False)
    wide = KERNELS.linear_packed_bf16(x, packed, n, bias, float_out=True)
    assert wide.dtype == torch.float32 and wide.shape == (rows, n)
    assert torch.equal(wide, KERNELS.linear_packed_bf16(x, packed, n, bias).float())


@pytest.mark.parametrize("rows,n", [(1, 49), (7, 300), (32, 2000)])
def test_packed_gemm_argmax_out_is_torch_argmax_of_the_logits(rows, n):
    # Greedy sampling takes the LM head's fused argmax: it must be torch.argmax of the very
    # logits returned, with ties (first index), a masked last block, NaN and all -inf rows.
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(n, 64, generator=gen).bfloat16()
    w[n // 3] = w[n - 1] = w[5]  # three equal columns per row: the first must win
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    x[0] = 0.0  # an all-zero row: every logit ties, argmax 0
    packed = KERNELS.pack_linear_bf16(w, False)
    ids = torch.full((rows,), -7, dtype=torch.int64)
    logits = KERNELS.linear_packed_bf16(x, packed, n, None, float_out=True, argmax_out=ids)
    assert torch.equal(logits, KERNELS.linear_packed_bf16(x, packed, n, None, float_out=True))
    assert torch.equal(ids, logits.argmax(-1))
    w[n - 2] = float("nan")  # every row's logit n - 2 is NaN: torch counts it as the maximum
    w[n // 2] = float("inf")
    packed = KERNELS.pack_linear_bf16(w, False)
    logits = KERNELS.linear_packed_bf16(x, packed, n, None, float_out=True, argmax_out=ids)
    assert torch.equal(ids, logits.argmax(-1))
    w = torch.full((n, 64), float("-inf")).bfloat16()
    logits = KERNELS.linear_packed_bf16(torch.ones(rows, 64).bfloat16(), KERNELS.pack_linear_bf16(w, False), n,
                                        None, float_out=True, argmax_out=ids)
    assert torch.equal(ids, logits.argmax(-1))
    with pytest.raises(RuntimeError, match="argmax_out"):
        KERNELS.linear_packed_bf16(x, packed, n, None, float_out=False, argmax_out=ids)


def test_packed_gemm_interleaves_gate_and_up_blocks():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(128, 64, generator=gen).bfloat16()  # gate rows 0..63, up rows 64..127
    x = torch.randn(3, 64, generator=gen).bfloat16()
    got = KERNELS.linear_packed_bf16(x, KERNELS.pack_linear_bf16(w, True), 128, None).float()
    order = [c for j in range(4) for c in [*range(16 * j, 16 * j + 16), *range(64 + 16 * j, 80 + 16 * j)]]
    expected = (x.float() @ w.float().t())[:, order]
    torch.testing.assert_close(got, expected, atol=2e-2 * expected.abs().max().item(), rtol=1e-2)


def test_packed_gemm_and_stack_reject_bad_input(tiny_llama_d64_dir, monkeypatch):
    with pytest.raises(RuntimeError, match="K must be even"):
        KERNELS.pack_linear_bf16(torch.zeros(16, 7, dtype=torch.bfloat16), False)
    with pytest.raises(RuntimeError, match="packed"):
        KERNELS.linear_packed_bf16(torch.zeros(2, 8, dtype=torch.bfloat16),
                                   torch.zeros(1, 3, 16, 2, dtype=torch.bfloat16), 16, None)
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.bfloat16, device="cpu")
    _, _, stack = run_steps(loaded, [[(0, 1), (0, 1), (0, 1)]], True, monkeypatch)
    check_stack_rejects_bad_kv_addresses(stack, loaded.config, torch.bfloat16, POOL, BLOCK)
