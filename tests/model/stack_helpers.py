"""Helpers for the fused decode stacks' tests (test_fused_decode.py: bf16, test_fused_decode_f32.py:
float32, test_gguf_stack.py, test_gguf_stack_gemma.py: GGUF): steps with the stack on or off, and
what a row's result must not depend on (the thread count, the rows beside it)."""

from __future__ import annotations

from typing import Callable, TypeVar

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import ENV_SWITCH
from cadence.model.kv_cache import KVCache

R = TypeVar("R")


def on_one_thread(run: Callable[[], R]) -> R:
    """run() with torch (and so the stacks' teams) on one thread, the thread count restored after."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return run()
    finally:
        torch.set_num_threads(threads)


def run_steps(model, config, steps: list[list[tuple[int, int]]], tables: list[list[int]], block: int, pool: int,
              stack: bool, monkeypatch, kv_dtype: torch.dtype = torch.float32):
    """Each step's spans ((start, new tokens) per sequence, its block table from `tables`) on random
    tokens, with the fused stack switched on or off (ENV_SWITCH; the model builds its stack again):
    (every step's logits concatenated, the final cache storage, the stack the model used or None)."""
    monkeypatch.setenv(ENV_SWITCH, "1" if stack else "0")
    model._decode_stack = None  # built again under the switch; the weights stay as they are
    kv = KVCache(config, pool, block, kv_dtype, "cpu")
    gen = torch.Generator().manual_seed(5)
    logits = []
    with torch.inference_mode():
        for spans in steps:
            meta = AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, tables)], block, pool)
            ids = torch.randint(0, config.vocab_size, (meta.num_tokens,), generator=gen)
            logits.append(model.compute_logits(model(ids, meta.positions, meta, kv)))
    return torch.cat(logits), kv.storage.clone(), model._decode_stack or None


def solo_and_batch_logits(model, config, kv_dtype: torch.dtype, prefill: list[tuple[int, int]],
                          tables: list[list[int]], block: int, pool: int, monkeypatch):
    """After a prefill of `prefill` ((start 0, tokens) per sequence, the block tables `tables`) on
    the stack's path, the logits of one decode token per sequence: (the first sequence's row in a
    step of its own [1, V], every sequence's row in one step [S, V]), the cache restored between."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    kv = KVCache(config, pool, block, kv_dtype, "cpu")
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        meta = AttentionMetadata.build([(s, n, t) for (s, n), t in zip(prefill, tables)], block, pool)
        model(torch.randint(0, config.vocab_size, (meta.num_tokens,), generator=gen), meta.positions, meta, kv)
        token = torch.randint(0, config.vocab_size, (len(prefill),), generator=gen)
        snapshot = kv.storage.clone()
        decode = [(s + n, 1, t) for (s, n), t in zip(prefill, tables)]
        meta1 = AttentionMetadata.build(decode[:1], block, pool)
        solo = model.compute_logits(model(token[:1], meta1.positions, meta1, kv))
        kv.storage.copy_(snapshot)
        meta_all = AttentionMetadata.build(decode, block, pool)
        batch = model.compute_logits(model(token, meta_all.positions, meta_all, kv))
    return solo, batch


def check_head_argmax_across_thread_spans(model, config, tables: list[list[int]], block: int, pool: int,
                                          attach: Callable[[torch.Tensor], None]) -> None:
    """A stack's argmax (the LM head in its parallel region) merges the threads' column spans of
    a row as torch.argmax does: the first index of a maximum that sits in two spans, and the first
    NaN wherever the maximum is. attach(head) gives the model's stack a float32 head [V, H] whose
    rows are the step's own final-norm row (logit |h|^2) at chosen columns, zero elsewhere, and
    NaN at others; forward_logits must return each case's torch.argmax."""
    V, H = config.vocab_size, config.hidden_size
    kv = KVCache(config, pool, block, torch.float32, "cpu")
    with torch.inference_mode():
        meta = AttentionMetadata.build([(0, 17, tables[0])], block, pool)
        model(torch.arange(meta.num_tokens) % V, meta.positions, meta, kv)
        meta = AttentionMetadata.build([(17, 1, tables[0])], block, pool)
        ids = torch.tensor([7])
        hidden = model(ids, meta.positions, meta, kv)[0]  # the step's final-norm row (rerun: same KV)
        for top, nan, want in (((V // 8, V - 3), (), V // 8), ((V // 2 + 1, V - 1), (), V // 2 + 1),
                               ((V // 8,), (V - 5,), V - 5), ((V - 2,), (V // 2 - 1, V - 9), V // 2 - 1)):
            head = torch.zeros(V, H)
            head[list(top)] = hidden
            head[list(nan)] = float("nan")
            attach(head)
            logits, argmax = model.forward_logits(ids, meta.positions, meta, kv, torch.tensor([0]))
            assert int(argmax[0]) == want == int(torch.argmax(logits[0]))


def check_head_gives_the_separate_heads_bits(model, config, tables: list[list[int]], block: int,
                                             pool: int) -> None:
    """forward_logits (a stack's LM head and argmax in its parallel region) gives the bits of
    forward then compute_logits_and_argmax, the argmax torch.argmax's (and the separate head's,
    where it gives one), and writes the same KV; it declines a step with prompt chunks (not every
    row sampled). Three sequences of 17, 9 and 3 prompt tokens, then decode steps."""
    kv = KVCache(config, pool, block, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(6)

    def meta_of(spans):
        return AttentionMetadata.build([(s, n, t) for (s, n), t in zip(spans, tables)], block, pool)

    with torch.inference_mode():
        meta = meta_of([(0, 17), (0, 9), (0, 3)])
        prompt = torch.randint(0, config.vocab_size, (meta.num_tokens,), generator=gen)
        assert model.forward_logits(prompt, meta.positions, meta, kv, torch.tensor([16, 25, 28])) is None
        model(prompt, meta.positions, meta, kv)
        assert model._decode_stack.head_size == config.vocab_size
        for spans in ([(17, 1), (9, 1), (3, 1)], [(18, 1)], [(19, 1), (10, 1)]):
            meta = meta_of(spans)
            ids = torch.randint(0, config.vocab_size, (meta.num_tokens,), generator=gen)
            before = kv.storage.clone()
            expected, expected_argmax = model.compute_logits_and_argmax(model(ids, meta.positions, meta, kv))
            expected_kv = kv.storage.clone()
            kv.storage.copy_(before)
            logits, argmax = model.forward_logits(ids, meta.positions, meta, kv, torch.arange(len(spans)))
            assert torch.isfinite(logits).all() and logits.abs().max() > 0
            assert torch.equal(logits, expected)
            assert torch.equal(argmax, expected.argmax(-1))
            assert expected_argmax is None or torch.equal(argmax, expected_argmax)
            assert torch.equal(kv.storage, expected_kv)


def check_stack_rejects_bad_kv_addresses(stack, config, dtype: torch.dtype, pool: int, block: int) -> None:
    """A stack's forward refuses, with a clear error, a slot past the cache, a context longer
    than its block table covers and a block id outside the pool (no out-of-bounds access)."""
    kv = KVCache(config, pool, block, dtype, "cpu")
    x = torch.zeros(1, config.hidden_size, dtype=dtype)
    cos = torch.zeros(1, 64)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    one = torch.ones(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="slot"):
        stack.forward(x, cos, cos, kv.storage, torch.tensor([pool * block]), table, one - 1, one, 0.125)
    with pytest.raises(RuntimeError, match="ctx_len"):
        stack.forward(x, cos, cos, kv.storage, one, table, one - 1, one * 9, 0.125)
    with pytest.raises(RuntimeError, match="block id"):
        stack.forward(x, cos, cos, kv.storage, one, torch.tensor([[pool]], dtype=torch.int32), one - 1, one, 0.125)
