"""The fused decode stack of GGUF-native models (kernels.DecodeStackGGUF, model/gguf_stack.py).

Random llama GGUF files (random_gguf.py): a Q4_K_M-like mix (Q4_K, with Q6_K v and down: both
repacked layouts, q/k read in place through their row order), a Q5_K_M-like one (repacked Q5_K
with Q6_K v and down), a Q3_K_M-like one (repacked Q3_K with row-wise Q2_K v and IQ4_XS down,
Q4_K output), a row-wise type (Q8_0) and float ones (F16, BF16), head_dim 64 and 128; and Qwen3
ones (per-head q/k norms before rope) in the Q4_K_M mix. The stack must give the per-op path's
bits: the logits of decode and short-chunk steps over scattered blocks and the KV it writes; and
a row's result must not depend on the rows beside it or on the thread count.
"""

from __future__ import annotations

import gc

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import ENV_SWITCH, STACK_MAX_CHUNK
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from .random_gguf import Q, write_random_gguf
from . import stack_helpers
from .stack_helpers import on_one_thread, solo_and_batch_logits

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not hasattr(KERNELS, "DecodeStackGGUF")
                                or KERNELS.kernel_tier() not in ("avx2", "avx512", "avx512bf16"),
                                reason="needs the CPU kernels built for a tier with AVX2 and FMA")

POOL, BLOCK = 96, 4
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(3)).tolist()
TABLES = [_ORDER[32 * i:32 * (i + 1)] for i in range(3)]
# (start, new tokens) per sequence: a prefill the stack takes, decodes, short chunks beside decodes.
STEPS = [[(0, 17), (0, 9), (0, 3)], [(17, 1), (9, 1), (3, 1)], [(18, 1), (10, 5), (4, 1)],
         [(19, STACK_MAX_CHUNK - 1), (15, 1), (5, 2)], [(50, 1), (16, 1), (7, 1)]]
Q4_K_M_MIX = {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}
LOW_BIT_MIX = {"attn_v": Q.Q2_K, "ffn_down": Q.IQ4_XS, "attn_output": Q.Q4_K}
# name: (layer type, other tensors' types, attention heads, kv heads, GGUF architecture)
MODELS = {
    "q4_k_m": (Q.Q4_K, Q4_K_M_MIX, 4, 2, "llama"),
    "q4_k_m_d128": (Q.Q4_K, Q4_K_M_MIX, 2, 1, "llama"),
    "q8_0": (Q.Q8_0, None, 4, 2, "llama"),
    "q5_k_m": (Q.Q5_K, Q4_K_M_MIX, 4, 2, "llama"),
    "q3_k_mix": (Q.Q3_K, LOW_BIT_MIX, 4, 2, "llama"),
    "f16": (Q.F16, None, 4, 2, "llama"),
    "bf16": (Q.BF16, None, 4, 2, "llama"),
    "qwen3_q4_k_m": (Q.Q4_K, Q4_K_M_MIX, 4, 2, "qwen3"),
    "qwen3_q4_k_m_d128": (Q.Q4_K, Q4_K_M_MIX, 2, 1, "qwen3"),
}


def _load(tmp_path, name: str, **twin):
    qtype, type_of, heads, kv_heads, arch = MODELS[name]
    path = write_random_gguf(str(tmp_path / f"{name}.gguf"), qtype, heads=heads, kv_heads=kv_heads, type_of=type_of,
                             arch=arch, **twin)
    return load_model(path, dtype="float32", device="cpu", quantization="gguf")


def run_steps(model, config, steps, stack: bool, monkeypatch):
    """Logits of every step, the final cache and the stack the model used (None: per-op)."""
    return stack_helpers.run_steps(model, config, steps, TABLES, BLOCK, POOL, stack, monkeypatch)


@pytest.mark.parametrize("name", list(MODELS))
def test_gguf_stack_gives_the_per_op_bits(tmp_path, monkeypatch, name):
    loaded = _load(tmp_path, name)
    model, config = loaded.model, loaded.config
    stack_logits, stack_kv, stack = run_steps(model, config, STEPS, True, monkeypatch)
    assert isinstance(stack, KERNELS.DecodeStackGGUF) and stack.num_layers == config.num_layers
    assert stack.has_qk_norms == config.qk_norm == name.startswith("qwen3")
    per_op_logits, per_op_kv, none = run_steps(model, config, STEPS, False, monkeypatch)
    assert none is None
    assert torch.isfinite(stack_logits).all() and stack_logits.abs().max() > 0
    assert torch.equal(stack_kv, per_op_kv)
    assert torch.equal(stack_logits, per_op_logits)


def test_gguf_stack_rows_do_not_depend_on_batch_or_threads(tmp_path, monkeypatch):
    loaded = _load(tmp_path, "q4_k_m")
    model, config = loaded.model, loaded.config
    steps = [[(0, 20), (0, 11), (0, 6)], [(20, 1), (11, 1), (6, 1)]]
    all_threads = run_steps(model, config, steps, True, monkeypatch)[0]
    assert torch.equal(all_threads, on_one_thread(lambda: run_steps(model, config, steps, True, monkeypatch)[0]))
    solo, batch = solo_and_batch_logits(model, config, torch.float32, steps[0], TABLES, BLOCK, POOL, monkeypatch)
    assert torch.equal(solo[0], batch[0])


@pytest.mark.parametrize("first", ["0.3", "0.75"])
def test_gguf_stack_bits_do_not_depend_on_the_threads_parts(tmp_path, monkeypatch, first):
    """The GEMV phases split their bytes by the stack's ThreadSplit (team.h), fitted to the
    threads' rates; any parts give the per-op path's bits (CADENCE_THREAD_SPLIT fixes thread 0's
    part when the stack is built)."""
    monkeypatch.setenv("CADENCE_THREAD_SPLIT", first)
    loaded = _load(tmp_path, "q4_k_m")
    model, config = loaded.model, loaded.config
    stack_logits, stack_kv, stack = run_steps(model, config, STEPS, True, monkeypatch)
    assert stack.thread_parts(2) == pytest.approx([0.0, float(first), 1.0])
    per_op_logits, per_op_kv, _ = run_steps(model, config, STEPS, False, monkeypatch)
    assert torch.equal(stack_kv, per_op_kv)
    assert torch.equal(stack_logits, per_op_logits)


def _decode_meta(spans):
    return AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, TABLES)], BLOCK, POOL)


@pytest.mark.parametrize("name", ["q4_k_m", "q3_k_mix", "bf16", "qwen3_q4_k_m"])
def test_gguf_stack_head_gives_the_logits_and_argmax_of_the_separate_head(tmp_path, monkeypatch, name):
    """forward_logits gives the bits of forward then compute_logits and the argmax, the same KV,
    and declines prompt chunks (stack_helpers.check_head_gives_the_separate_heads_bits)."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = _load(tmp_path, name)
    stack_helpers.check_head_gives_the_separate_heads_bits(loaded.model, loaded.config, TABLES, BLOCK, POOL)


def test_gguf_stack_head_argmax_is_torch_argmax_across_thread_spans(tmp_path, monkeypatch):
    """The argmax merges the threads' spans of a row as torch.argmax does (an F32 head planted
    with maxima, ties and NaNs: stack_helpers.check_head_argmax_across_thread_spans)."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = _load(tmp_path, "q4_k_m")
    model, config = loaded.model, loaded.config
    V, H = config.vocab_size, config.hidden_size

    def attach(head: torch.Tensor) -> None:
        model._decode_stack.attach_head(blocks=head.view(torch.uint8).reshape(V, 4 * H), type=int(Q.F32),
                                        packed=None, bias=None, N=V)

    stack_helpers.check_head_argmax_across_thread_spans(model, config, TABLES, BLOCK, POOL, attach)


def test_gguf_stack_logits_pages_are_reused_only_once_dropped(tmp_path, monkeypatch):
    """forward_logits writes its logits on the stack's kept pages (kernels/page_pool.h): a step's
    logits still held (or a view of them) are never written by the next step, a dropped block is
    taken again, and a tensor outlives the stack that made it."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    loaded = _load(tmp_path, "q4_k_m")
    model, config = loaded.model, loaded.config
    kv = KVCache(config, POOL, BLOCK, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        meta = _decode_meta(STEPS[0])
        model(torch.randint(0, config.vocab_size, (meta.num_tokens,), generator=gen), meta.positions, meta, kv)
        stack = model._decode_stack
        meta = _decode_meta([(17, 1), (9, 1), (3, 1)])
        first, _ = model.forward_logits(torch.tensor([5, 6, 7]), meta.positions, meta, kv, torch.arange(3))
        kept = first.clone()
        row = first[1]  # a view: holds the block as the tensor does
        first_ptr = first.data_ptr()
        del first
        second, _ = model.forward_logits(torch.tensor([8, 9, 10]), meta.positions, meta, kv, torch.arange(3))
        assert second.data_ptr() != first_ptr and torch.equal(row, kept[1])
        assert not torch.equal(second, kept)  # other tokens: other logits (the test would see a reuse)
        second_ptr = second.data_ptr()
        del row, second
        third = stack.new_logits(3)
        assert third.shape == (3, config.vocab_size) and third.dtype == torch.float32
        assert third.data_ptr() in (first_ptr, second_ptr)
        third.fill_(2.0)
        del stack
        model._decode_stack = None
        gc.collect()
        assert float(third.sum()) == 2.0 * 3 * config.vocab_size  # still mapped after the stack went


def test_qwen3_stack_matches_float_twin_and_per_op_greedy_tokens(tmp_path, monkeypatch):
    """A Qwen3 Q4_K_M file (q/k norms) decodes through the GGUF stack: its logits agree with the
    float32 twin (the blocks' dequantized values, loaded the float way: the float32 stack with
    the same q/k norms) within 8-bit activations' error, and the engine's greedy tokens are the
    per-op path's (CADENCE_DECODE_STACK=0) whatever the batch."""
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.llm import LLM

    twin_path = str(tmp_path / "twin.gguf")
    native = _load(tmp_path, "qwen3_q4_k_m", float_twin=twin_path)
    twin = load_model(twin_path, dtype="float32", device="cpu", quantization="none")
    assert native.config.qk_norm and native.config.stack_computes()
    steps = STEPS[:3]
    ours, _, stack = run_steps(native.model, native.config, steps, True, monkeypatch)
    ref, _, twin_stack = run_steps(twin.model, twin.config, steps, True, monkeypatch)
    assert isinstance(stack, KERNELS.DecodeStackGGUF) and stack.has_qk_norms
    assert isinstance(twin_stack, KERNELS.DecodeStackF32) and twin_stack.has_qk_norms
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel < 0.06, rel

    path = str(tmp_path / "qwen3_q4_k_m.gguf")
    prompts = [[(5 * i + j) % 500 + 2 for j in range(9 + 7 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV_SWITCH, switch)
        llm = LLM(path, quantization="gguf", dtype="float32", max_num_batched_tokens=512, num_gpu_blocks_override=64)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        tokens[switch] = [list(o.outputs[0].token_ids) for o in outputs]
        model = llm.engine.executor.model
        assert bool(model._decode_stack) == (switch == "1")
    assert tokens["1"] == tokens["0"]
