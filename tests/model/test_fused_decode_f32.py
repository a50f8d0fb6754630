"""The float32 fused decode stack (kernels.DecodeStackF32) and the compressed packed GEMM under it
(every kernel tier with AVX2 + FMA: Zen 2/3, Zen 4, Intel since Haswell).

Checked on tiny head_dim-64 Llama, Qwen2 (bias) and Qwen3 (q/k norms) checkpoints against the per-op float32 path
over the same (rounded) weights and against the unrounded float32 reference, for each packed
weight format: decodes and short chunks over scattered blocks, the KV it writes, batch and
thread-count invariance, the fused argmax, the LM head in the stack's call and bad input.
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.fused_decode import ENV_SWITCH, STACK_MAX_CHUNK, WEIGHT_FORMATS, stored_values
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.loader import load_model
from . import stack_helpers
from .stack_helpers import check_stack_rejects_bad_kv_addresses, on_one_thread, solo_and_batch_logits

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not hasattr(KERNELS, "DecodeStackF32")
                                or KERNELS.kernel_tier() == "generic",
                                reason="needs the CPU kernels built for a tier with AVX2 and FMA")

POOL, BLOCK = 96, 4
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(3)).tolist()
TABLES = [_ORDER[32 * i:32 * (i + 1)] for i in range(3)]
STEPS = [[(0, 17), (0, 9), (0, 3)], [(17, 1), (9, 1), (3, 1)], [(18, 1), (10, 5), (4, 1)],
         [(19, STACK_MAX_CHUNK - 1), (15, 1), (5, 2)], [(50, 1), (16, 1), (7, 1)],
         [(51, 1), (17, 1), (8, 1)]]


def run_steps(model, config, steps, stack: bool, monkeypatch):
    """Logits of every step, the final cache and the stack the model used (float32 model)."""
    return stack_helpers.run_steps(model, config, steps, TABLES, BLOCK, POOL, stack, monkeypatch)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_f32_stack_matches_per_op_path_and_reference(request, arch, fmt, monkeypatch):
    path = request.getfixturevalue(f"tiny_{arch}_d64_dir")
    loaded = load_model(path, dtype=torch.float32, device="cpu")
    reference = load_model(path, dtype=torch.float32, device="cpu")  # float32 weights: the reference
    loaded.model.set_decode_weight_format(fmt)
    stack_logits, stack_kv, stack = run_steps(loaded.model, loaded.config, STEPS, True, monkeypatch)
    assert stack and stack.weight_format == WEIGHT_FORMATS[fmt]
    assert stack.has_qk_norms == (arch == "qwen3")
    # The model's own weights now hold the packed copy's values: the per-op path computes with
    # the same weights (int8: on the same quantized activations), so only the summation order
    # differs.
    per_op_logits, per_op_kv, _ = run_steps(loaded.model, loaded.config, STEPS, False, monkeypatch)
    if fmt in ("int8", "int4"):
        # A summation-order difference can move an activation across a rounding boundary of its
        # int8 quantization (one quantum, then carried by the KV to the sequence's later rows):
        # the paths agree within the quantization's error (the packed GEMM's own exactness is
        # checked below against the same quantized activations).
        # (This tiny random model is far more sensitive than a trained one: SmolLM2's int8
        # top-1 agreement with float32 is ~99%, benchmarks/quality_bench.py.)
        assert (stack_logits - per_op_logits).abs().max() <= 0.1 * per_op_logits.abs().max()
        assert (stack_logits.argmax(-1) == per_op_logits.argmax(-1)).float().mean() >= 0.9
    else:
        torch.testing.assert_close(stack_logits, per_op_logits, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(stack_kv, per_op_kv, atol=2e-5, rtol=1e-4)
        assert torch.equal(stack_logits.argmax(-1), per_op_logits.argmax(-1))
    if fmt == "int4":
        # 16 levels per group are far from this random model's float32 weights (a trained
        # model's Q4 file loses little: SmolLM2's is stored int4-exact, quality_bench.py).
        return
    # Against the unrounded float32 model: exact for float32, close for the compressed formats.
    monkeypatch.setenv(ENV_SWITCH, "0")
    ref_logits, _, _ = run_steps(reference.model, reference.config, STEPS, False, monkeypatch)
    err = (stack_logits - ref_logits).abs().max().item()
    assert err <= {"float32": 2e-4, "bf16": 0.05, "int8": 0.1}[fmt] * ref_logits.abs().max().item(), err
    assert (stack_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("fmt", ["float32", "int8", "int4"])
def test_f32_stack_rows_do_not_depend_on_batch_or_threads(tiny_llama_d64_dir, monkeypatch, fmt):
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    model, config = loaded.model, loaded.config
    prefill = [[(0, 20), (0, 11), (0, 6)]]
    steps = prefill + [[(20, 1), (11, 1), (6, 1)]]
    alone = run_steps(model, config, steps, True, monkeypatch)[0]
    assert torch.equal(alone, on_one_thread(lambda: run_steps(model, config, steps, True, monkeypatch)[0]))
    solo, batch = solo_and_batch_logits(model, config, torch.float32, prefill[0], TABLES, BLOCK, POOL, monkeypatch)
    assert torch.equal(solo[0], batch[0])


def test_f32_stack_long_context_spans_merge(tiny_llama_d64_dir, monkeypatch):
    # Contexts over one attention span (256 positions): partials of several spans are merged.
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    model, config = loaded.model, loaded.config
    global TABLES
    saved = TABLES
    try:
        TABLES = [list(range(90))]
        steps = [[(0, 300)], [(300, 1)], [(301, 7)]]
        pool_kv = run_steps(model, config, steps, True, monkeypatch)
        per_op = run_steps(model, config, steps, False, monkeypatch)
    finally:
        TABLES = saved
    torch.testing.assert_close(pool_kv[0], per_op[0], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "int8", "int4"])
def test_f32_stack_head_gives_the_logits_and_argmax_of_the_separate_head(tiny_llama_d64_dir, monkeypatch, fmt):
    """forward_logits (the packed LM head and its argmax in the stack's parallel region) gives the
    bits of forward then compute_logits_and_argmax (linear_packed_f32 on the same packed head),
    the same KV, and declines prompt chunks (stack_helpers.check_head_gives_the_separate_heads_bits)."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    stack_helpers.check_head_gives_the_separate_heads_bits(loaded.model, loaded.config, TABLES, BLOCK, POOL)


def test_f32_stack_head_argmax_is_torch_argmax_across_thread_spans(tiny_llama_d64_dir, monkeypatch):
    """The stack's argmax merges the threads' column blocks as torch.argmax does (a float32 head
    planted with maxima, ties and NaNs: stack_helpers.check_head_argmax_across_thread_spans)."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    model, config = loaded.model, loaded.config

    def attach(head: torch.Tensor) -> None:
        data, scales = KERNELS.pack_weight_f32(head, WEIGHT_FORMATS["float32"])
        model._decode_stack.attach_head(data=data, scales=scales, format=WEIGHT_FORMATS["float32"],
                                        N=config.vocab_size)

    stack_helpers.check_head_argmax_across_thread_spans(model, config, TABLES, BLOCK, POOL, attach)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("rows, n, k", [(1, 960, 576), (3, 100, 64), (7, 48, 96), (33, 250, 128)])
def test_packed_f32_gemm_matches_stored_values(fmt, rows, n, k):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    data, scales = KERNELS.pack_weight_f32(w, WEIGHT_FORMATS[fmt])
    # int8 multiplies activations quantized per group of 32 (checked against Python below).
    x_seen = KERNELS.quantize_activations_q8(x) if fmt in ("int8", "int4") else x
    expected = x_seen @ stored_values(w, fmt).t() + bias
    ids = torch.full((rows,), -1, dtype=torch.int64)
    got = KERNELS.linear_packed_f32(x, data, scales, WEIGHT_FORMATS[fmt], n, bias, ids)
    torch.testing.assert_close(got, expected, atol=1e-4 * k ** 0.5, rtol=1e-4)
    assert torch.equal(ids, got.argmax(-1))


@pytest.mark.parametrize("fmt", ["float32", "bf16", "int8", "int4"])
def test_packed_f32_gemm_rows_do_not_depend_on_the_batch(fmt):
    """A row's result has the same bits alone, in small batches (weights widened per tile) and in
    large ones (each block widened once into a float32 scratch shared by the row tiles)."""
    gen = torch.Generator().manual_seed(4)
    n, k = 200, 160
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(40, k, generator=gen)
    data, scales = KERNELS.pack_weight_f32(w, WEIGHT_FORMATS[fmt])
    whole = KERNELS.linear_packed_f32(x, data, scales, WEIGHT_FORMATS[fmt], n)
    for rows in (1, 2, 5, 6, 7, 13, 33):
        part = KERNELS.linear_packed_f32(x[:rows].contiguous(), data, scales, WEIGHT_FORMATS[fmt], n)
        assert torch.equal(part, whole[:rows]), rows


def test_packed_f32_argmax_ties_nan_and_inf():
    n, rows = 300, 5
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(n, 64, generator=gen)
    w[n // 3] = w[n - 1] = w[5]
    x = torch.randn(rows, 64, generator=gen)
    x[0] = 0.0
    ids = torch.empty(rows, dtype=torch.int64)
    data, scales = KERNELS.pack_weight_f32(w, 0)
    logits = KERNELS.linear_packed_f32(x, data, scales, 0, n, None, ids)
    assert torch.equal(ids, logits.argmax(-1))
    w[n - 2] = float("nan")
    data, scales = KERNELS.pack_weight_f32(w, 0)
    logits = KERNELS.linear_packed_f32(x, data, scales, 0, n, None, ids)
    assert torch.equal(ids, logits.argmax(-1))


def quantize_rows_reference(x: torch.Tensor) -> torch.Tensor:
    """What the int8 GEMM multiplies, in plain torch: each row per group of 32, symmetric, scale
    amax / 127, rounded half to even, dequantized."""
    groups = x.reshape(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(groups * inv) * (amax / 127.0)).reshape_as(x)


def test_int8_activation_quantization_matches_reference():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(9, 256, generator=gen) * torch.logspace(-3, 3, 9).unsqueeze(1)
    x[1] = 0.0  # an all-zero row: scale 0, values 0
    x[2, :32] = 0.0
    x[3, 5] = 1e6  # one outlier takes its group's range
    x[4] = torch.arange(256) % 4 - 1.5  # halves: round to even
    got = KERNELS.quantize_activations_q8(x)
    assert torch.equal(got, quantize_rows_reference(x))
    assert torch.equal(got[1], torch.zeros(256))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        KERNELS.quantize_activations_q8(torch.zeros(2, 40))


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_packed_f32_interleaves_gate_and_up_blocks(fmt):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(128, 64, generator=gen)
    x = torch.randn(3, 64, generator=gen)
    data, scales = KERNELS.pack_weight_f32(w, WEIGHT_FORMATS[fmt], True)
    got = KERNELS.linear_packed_f32(x, data, scales, WEIGHT_FORMATS[fmt], 128)
    order = [c for j in range(4) for c in [*range(16 * j, 16 * j + 16), *range(64 + 16 * j, 80 + 16 * j)]]
    x_seen = quantize_rows_reference(x) if fmt in ("int8", "int4") else x
    torch.testing.assert_close(got, (x_seen @ stored_values(w, fmt).t())[:, order], atol=1e-4, rtol=1e-4)


def test_packed_f32_and_stack_reject_bad_input(tiny_llama_d64_dir, monkeypatch):
    with pytest.raises(RuntimeError, match="multiple of 32"):
        KERNELS.pack_weight_f32(torch.zeros(16, 40), 2)
    data, scales = KERNELS.pack_weight_f32(torch.zeros(16, 64), 1)
    with pytest.raises(RuntimeError, match="K"):
        KERNELS.linear_packed_f32(torch.zeros(2, 32), data, scales, 1, 16)
    with pytest.raises(RuntimeError, match="format"):
        KERNELS.linear_packed_f32(torch.zeros(2, 64), data, scales, 0, 16)
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    _, _, stack = run_steps(loaded.model, loaded.config, [[(0, 1), (0, 1), (0, 1)]], True, monkeypatch)
    check_stack_rejects_bad_kv_addresses(stack, loaded.config, torch.float32, POOL, BLOCK)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_integer_per_op_chunks_run_on_the_stacks_packed_weights(request, arch, fmt, monkeypatch):
    """Chunks longer than the stack takes (up to PACKED_GEMM_MAX_ROWS rows) run their GEMMs on
    the stack's packed int8 weights (integer dot products, the same packed copy: no second one)
    and agree with torch's float32 GEMM on the same quantized activations."""
    import cadence.model.llama as llama

    loaded = load_model(request.getfixturevalue(f"tiny_{arch}_d64_dir"), dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    calls = []
    original = llama.PackedInteger.linear
    monkeypatch.setattr(llama.PackedInteger, "linear",
                        lambda self, x, bias, kernels: calls.append(x.shape[0]) or original(self, x, bias, kernels))
    long_chunk = [[(0, STACK_MAX_CHUNK + 9), (0, 3)], [(STACK_MAX_CHUNK + 9, 1), (3, 1)]]
    packed_logits, packed_kv, stack = run_steps(loaded.model, loaded.config, long_chunk, True, monkeypatch)
    layers = loaded.config.num_layers
    # 4 GEMMs per layer for the 44-row step; the decode step ran in the stack.
    assert calls == [STACK_MAX_CHUNK + 12] * 4 * layers
    assert stack.packed_layer(0)[0].data_ptr() == loaded.model.model.layers[0].self_attn.packed[0].data.data_ptr()
    calls.clear()
    monkeypatch.setattr(llama, "PACKED_GEMM_MAX_ROWS", 0)
    torch_logits, torch_kv, _ = run_steps(loaded.model, loaded.config, long_chunk, True, monkeypatch)
    assert calls == []
    # Same quantized activations and weights; float32 summation order only (see above for why
    # int8 agreement is within a quantum rather than exact).
    assert (packed_logits - torch_logits).abs().max() <= 0.1 * torch_logits.abs().max()
    assert (packed_logits.argmax(-1) == torch_logits.argmax(-1)).float().mean() >= 0.9
    torch.testing.assert_close(packed_kv, torch_kv, atol=0.05, rtol=0.05)
    # Reloading weights drops the stack and the per-op path's views of it together.
    loaded.model.drop_packed_weights()
    assert all(layer.self_attn.packed is None and layer.mlp.packed is None for layer in loaded.model.model.layers)
