"""A float16 / bf16 KV cache under float32 compute (--kv-cache-dtype float16|bfloat16).

The kernels widen 16-bit K/V to float32 in registers and compute exactly as on a float32 cache:
with the cache's values rounded to float16 (bf16) and stored as float32, every kernel must give
the same bits as on the 16-bit cache itself. The writes round as torch's cast does. Through the
model: the fused float32 stack and the per-op path agree on a 16-bit cache, rows stay
batch-invariant, and logits stay close to the float32 cache's.
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache, kv_bytes_per_block, kv_cache_dtype
from cadence.model.loader import load_model
from cadence.model.prefill_attention import F32_KERNEL_TIERS
from .stack_helpers import run_steps, solo_and_batch_logits

HQ, HKV, BLOCK = 8, 2, 16
DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels():
    k = load_cpu_kernels()
    if k is None or k.kernel_tier() not in F32_KERNEL_TIERS:
        pytest.skip("no float32 kernel tier on this CPU")
    return k


def _step(head_dim: int, gen: torch.Generator):
    """Query rows of a mixed step (a 300-row prompt chunk crossing span 256, a 20-row chunk, two
    decodes) over scattered blocks: (q, kc, vc, tables, seq, lens)."""
    chunks = [(5, 300), (600, 20), (700, 1), (17, 1)]
    max_blocks = 48
    num_blocks = max_blocks * len(chunks)
    kc = torch.randn(num_blocks, BLOCK, HKV, head_dim, generator=gen)
    vc = torch.randn(num_blocks, BLOCK, HKV, head_dim, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(len(chunks), max_blocks).contiguous()
    seq = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, (_, n) in enumerate(chunks)])
    lens = torch.cat([torch.arange(start + 1, start + n + 1) for start, n in chunks])
    q = torch.randn(seq.numel(), HQ, head_dim, generator=gen)
    return q, kc, vc, tables, seq, lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 96])
def test_paged_attention_on_16bit_cache_is_float32_arithmetic_on_its_values(kernels, dtype, head_dim):
    # head_dim 96 takes the generic kernel (no AVX2 span kernel for it), 64 / 128 the span kernel.
    q, kc, vc, tables, seq, lens = _step(head_dim, torch.Generator().manual_seed(7))
    k16, v16 = kc.to(dtype), vc.to(dtype)
    scale = head_dim ** -0.5
    on_16bit = kernels.paged_attention(q, k16, v16, tables, seq, lens, scale)
    on_rounded = kernels.paged_attention(q, k16.float(), v16.float(), tables, seq, lens, scale)
    assert on_16bit.dtype == torch.float32
    if head_dim == 96:  # the generic loop may vectorise the widening differently: close
        torch.testing.assert_close(on_16bit, on_rounded, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(on_16bit, on_rounded)
    # And close to the unrounded cache (float16: 11-bit mantissa; bf16: 8).
    exact = kernels.paged_attention(q, kc, vc, tables, seq, lens, scale)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    assert (on_16bit - exact).abs().max().item() < tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_write_kv_rounds_into_16bit_cache_as_torch(kernels, dtype):
    gen = torch.Generator().manual_seed(3)
    T, D = 5, 64
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, generator=gen)
    cos, sin = torch.randn(T, D, generator=gen), torch.randn(T, D, generator=gen)
    slots = torch.tensor([3, 40, 17, 8, 63])
    k32, v32 = torch.zeros(4, BLOCK, HKV, D), torch.zeros(4, BLOCK, HKV, D)
    k16, v16 = k32.to(dtype), v32.to(dtype)
    a, b = qkv.clone(), qkv.clone()
    kernels.rope_write_kv(a, cos, sin, HQ, HKV, k32, v32, slots)
    kernels.rope_write_kv(b, cos, sin, HQ, HKV, k16, v16, slots)
    assert torch.equal(a, b)  # q and k rotated alike, in float32
    assert torch.equal(k16, k32.to(dtype)) and torch.equal(v16, v32.to(dtype))
    with pytest.raises(RuntimeError, match="caches must share"):
        kernels.rope_write_kv(qkv.to(torch.bfloat16), cos, sin, HQ, HKV, k16.half(), v16.half(), slots)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_prompt_from_position_0_attends_over_its_keys_as_the_cache_holds_them(kernels, dtype, head_dim):
    # head_dim 32: no paged-kernel row path, the chunk's own K/V go to SDPA; they must be the
    # cache's rounded values (those every later chunk reads), or chunking would change results.
    from cadence.model.attention import write_kv
    from cadence.model.attention_cpu import paged_attention_cpu

    gen = torch.Generator().manual_seed(11)
    n, table = 40, [2, 0, 1]
    q = torch.randn(n, HQ, head_dim, generator=gen)
    k, v = torch.randn(n, HKV, head_dim, generator=gen), torch.randn(n, HKV, head_dim, generator=gen)
    meta = AttentionMetadata.build([(0, n, table)], BLOCK, len(table))
    outs = []
    for cache_dtype, keys, values in ((dtype, k, v), (torch.float32, k.to(dtype).float(), v.to(dtype).float())):
        kc = torch.zeros(len(table), BLOCK, HKV, head_dim, dtype=cache_dtype)
        vc = torch.zeros_like(kc)
        write_kv(kc, vc, keys, values, meta.slot_mapping)
        outs.append(paged_attention_cpu(kernels, q, keys, values, kc, vc, meta, head_dim ** -0.5))
    assert torch.equal(outs[0], outs[1])


def test_kv_cache_dtype_resolution():
    assert kv_cache_dtype("auto", torch.float32) == torch.float32
    assert kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("float16", torch.float32) == torch.float16
    assert kv_cache_dtype("bfloat16", torch.float32) == torch.bfloat16
    assert kv_cache_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="float16 is not supported with a bfloat16 model"):
        kv_cache_dtype("float16", torch.bfloat16)
    with pytest.raises(ValueError, match="use auto"):
        kv_cache_dtype("int8", torch.float32)


POOL, MODEL_BLOCK = 96, 4
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(3)).tolist()
TABLES = [_ORDER[32 * i:32 * (i + 1)] for i in range(3)]
STEPS = [[(0, 17), (0, 9), (0, 3)], [(17, 1), (9, 1), (3, 1)], [(18, 1), (10, 5), (4, 1)],
         [(19, 40), (15, 1), (5, 2)], [(59, 1), (16, 1), (7, 1)]]


def _run(model, config, kv_dtype, stack: bool, monkeypatch, steps=STEPS):
    """Logits of every step and the final cache storage (kv_dtype)."""
    logits, kv, _ = run_steps(model, config, steps, TABLES, MODEL_BLOCK, POOL, stack, monkeypatch, kv_dtype)
    return logits, kv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["float32", "int4"])
def test_model_on_16bit_cache_stack_matches_per_op_and_float32_cache(kernels, tiny_llama_d64_dir, monkeypatch,
                                                                      dtype, fmt):
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    model, config = loaded.model, loaded.config
    stack, stack_kv = _run(model, config, dtype, True, monkeypatch)
    assert model._decode_stack is not None  # the fused float32 stack took the decode steps
    per_op, per_op_kv = _run(model, config, dtype, False, monkeypatch)
    assert stack_kv.dtype == dtype
    if fmt == "float32":
        torch.testing.assert_close(stack, per_op, atol=2e-4, rtol=1e-4)
    else:  # int4: activations quantized per group; a summation-order difference may move one
        assert (stack - per_op).abs().max() <= 0.1 * per_op.abs().max()
    f32, _ = _run(model, config, torch.float32, True, monkeypatch)
    err = (stack - f32).abs().max().item() / f32.abs().max().item()
    # int4 quantizes activations per group: a K/V rounding can move one across a step of this
    # tiny random model's (very sensitive) quantization, as a summation order can above.
    limit = 0.1 if fmt == "int4" else {torch.float16: 0.01, torch.bfloat16: 0.05}[dtype]
    assert err < limit, err
    assert (stack.argmax(-1) == f32.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_on_16bit_cache_do_not_depend_on_the_batch(kernels, tiny_llama_d64_dir, monkeypatch, dtype):
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format("int4")
    model, config = loaded.model, loaded.config
    solo, batch = solo_and_batch_logits(model, config, dtype, [(0, 20), (0, 11), (0, 6)], TABLES, MODEL_BLOCK, POOL,
                                        monkeypatch)
    assert torch.equal(solo[0], batch[0])


def test_pure_torch_path_reads_a_16bit_cache(tiny_llama_d64_dir, monkeypatch):
    # CADENCE_CPU_KERNELS=0 (or a device without the kernels): the cache is widened in torch.
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu", quantization="none")
    model, config = loaded.model, loaded.config
    monkeypatch.setattr("cadence.model.llama.cpu_kernels_for", lambda x: None)
    f16, kv = _run(model, config, torch.float16, False, monkeypatch)
    f32, _ = _run(model, config, torch.float32, False, monkeypatch)
    assert kv.dtype == torch.float16
    assert (f16 - f32).abs().max().item() < 0.01 * f32.abs().max().item()


def test_pool_bytes_follow_the_dtype_and_gqa_shape():
    # A Llama 3.x-like GQA shape: 8 KV heads of 128 dims (32 query heads), few layers.
    from cadence.model.config import ModelConfig

    cfg = ModelConfig(architecture="llama", vocab_size=256, hidden_size=4096, intermediate_size=256, num_layers=3,
                      num_heads=32, num_kv_heads=8, head_dim=128)
    blocks, block_size = 5, 16
    for dtype, size in ((torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2)):
        per_block = 3 * 2 * block_size * 8 * 128 * size
        assert kv_bytes_per_block(cfg, block_size, dtype) == per_block
        kv = KVCache(cfg, blocks, block_size, dtype, "cpu")
        assert kv.storage.numel() * kv.storage.element_size() == blocks * per_block


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["none", "auto"])
def test_default_model_logits_on_16bit_cache_teacher_forced(kernels, quantization):
    # The default model over the same tokens (16-token prompt, then 32 decode steps) with each
    # cache. Float32 weights show the cache's own error; int4 (the default, `auto`) quantizes
    # every GEMM's activations per group of 32, which amplifies any perturbation alike
    # (measured: mean |logprob difference| 0.001 float16 / 0.008 bf16 on float32 weights,
    # ~0.12 for both on int4 or int8), while every argmax stays.
    loaded = load_model(None, dtype="float32", device="cpu", quantization=quantization)
    model, config = loaded.model, loaded.config
    text = ("Once upon a time, in a small village, there lived an old man who loved to tell stories "
            "about the sea and the stars. Every evening the children gathered")
    ids = loaded.tokenizer.encode(text)[:48]
    table = list(range(4))
    logprobs = {}
    with torch.inference_mode():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            kv = KVCache(config, 8, 16, dtype, "cpu")
            meta = AttentionMetadata.build([(0, 16, table)], 16, 8)
            model(torch.tensor(ids[:16]), meta.positions, meta, kv)
            rows = []
            for pos in range(16, len(ids)):
                meta = AttentionMetadata.build([(pos, 1, table)], 16, 8)
                rows.append(model.compute_logits(model(torch.tensor(ids[pos:pos + 1]), meta.positions, meta, kv)))
            logprobs[dtype] = torch.log_softmax(torch.cat(rows), -1)
    ref = logprobs[torch.float32]
    limits = {"none": {torch.float16: (0.005, 0.05), torch.bfloat16: (0.03, 0.3)},
              "auto": {torch.float16: (0.25, 1.5), torch.bfloat16: (0.25, 1.5)}}[quantization]
    for dtype, (mean_limit, max_limit) in limits.items():
        diff = (logprobs[dtype] - ref).abs()
        assert diff.mean().item() < mean_limit and diff.max().item() < max_limit, (dtype, diff.mean(), diff.max())
        assert (logprobs[dtype].argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.parametrize("dtype", DTYPES)
def test_gguf_stack_on_16bit_cache_gives_the_per_op_bits(kernels, tmp_path, monkeypatch, dtype):
    # A GGUF-native model (Q4_K_M-like mix): its fused stack and its per-op path on one 16-bit cache.
    from .random_gguf import Q, write_random_gguf

    path = write_random_gguf(str(tmp_path / "m.gguf"), Q.Q4_K, heads=4, kv_heads=2,
                             type_of={"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K})
    loaded = load_model(path, dtype="float32", device="cpu", quantization="gguf")
    model, config = loaded.model, loaded.config
    stack, stack_kv = _run(model, config, dtype, True, monkeypatch)
    assert model._decode_stack is not None and hasattr(model._decode_stack, "num_layers")
    per_op, per_op_kv = _run(model, config, dtype, False, monkeypatch)
    assert torch.equal(stack_kv, per_op_kv) and stack_kv.dtype == dtype
    assert torch.equal(stack, per_op)
