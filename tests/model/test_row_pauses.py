"""Pause points between row blocks of a layer's ops (model/pause_points.py, issue 34).

An interleaved prompt chunk (--core-split interleave) runs its layers' GEMMs, attention and MLP
over blocks of rows, pausing between two blocks when a decode step is due. A prompt's logits and
K/V must be the bits of the same step run whole (invariant 1), also when another sequence's
whole forward runs at every pause (the interleaved decode step), and the blocks are taken only
where each row's numbers do not depend on the block (packed integer GEMMs, the paged kernel).
"""

from __future__ import annotations

import pytest
import torch

from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.fused_decode import has_f32_stack
from cadence.model.kernels.cpu_ops import load_cpu_kernels
from cadence.model.kv_cache import KVCache
from cadence.model.loader import load_model
from cadence.model.pause_points import PausePoints

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None or not has_f32_stack(KERNELS),
                                reason="needs the CPU kernels built for a tier with AVX2 and FMA")

POOL, BLOCK = 32, 16
_ORDER = torch.randperm(POOL, generator=torch.Generator().manual_seed(5)).tolist()
TABLES = {"A": _ORDER[:12], "B": _ORDER[12:24], "D": _ORDER[24:]}
LENGTHS = {"A": 150, "B": 60, "D": 20}
# A's prompt in two chunks, the second beside B's prompt (rows of two sequences in one block).
PREFILL = [[("A", 0, 90)], [("B", 0, 60), ("A", 90, 60)]]


def _tokens(vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {s: torch.randint(0, vocab, (n,), generator=gen) for s, n in LENGTHS.items()}


def _forward(model, tokens, kv, step, between=None) -> torch.Tensor:
    meta = AttentionMetadata.build([(start, n, TABLES[s]) for s, start, n in step], BLOCK, POOL)
    ids = torch.cat([tokens[s][start:start + n] for s, start, n in step])
    return model(ids, meta.positions, meta, kv, between_layers=between)


def _run(model, config, row_block: int) -> tuple[torch.Tensor, torch.Tensor, list[int], bool]:
    """PREFILL's steps (with PausePoints of `row_block` rows, always due, where > 0) ->
    (the hidden rows of every step, the K/V of A and B, pause calls per step, rows split).
    At every pause sequence D decodes one more token (a whole other forward on the model)."""
    tokens = _tokens(config.vocab_size)
    kv = KVCache(config, POOL, BLOCK, torch.float32, "cpu")
    kv.storage.zero_()
    hidden, calls, split = [], [], False
    with torch.inference_mode():
        _forward(model, tokens, kv, [("D", 0, 8)])
        decoded = [8]

        def decode_step() -> None:
            if decoded[0] < LENGTHS["D"]:
                _forward(model, tokens, kv, [("D", decoded[0], 1)])
                decoded[0] += 1
            calls[-1] += 1

        for step in PREFILL:
            calls.append(0)
            points = PausePoints(decode_step, row_block) if row_block else None
            if points is not None:
                points.due_at = 0.0  # always due: every pause point runs the hook
            hidden.append(_forward(model, tokens, kv, step, points))
            split = split or (points is not None and points.split_rows)
    slots = torch.tensor([TABLES[s][p // BLOCK] * BLOCK + p % BLOCK for s in "AB" for p in range(LENGTHS[s])])
    return torch.cat(hidden), kv.storage.flatten(2, 3)[:, :, slots].clone(), calls, split


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_row_blocks_give_the_whole_steps_bits(tiny_llama_d64_dir, fmt):
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format(fmt)
    base_hidden, base_kv, _, split = _run(loaded.model, loaded.config, 0)
    assert not split
    layers = loaded.config.num_layers
    for row_block in (16, 24, 64):
        hidden, kv, calls, split = _run(loaded.model, loaded.config, row_block)
        assert split, row_block
        assert torch.equal(hidden, base_hidden), row_block
        assert torch.equal(kv, base_kv), row_block
        # Per step: a boundary between two layers and one mid-layer, plus the pauses between
        # row blocks of the attention and of the MLP in every layer.
        for step, n in zip(PREFILL, calls):
            rows = sum(t for _, _, t in step)
            inside = 2 * (-(-rows // row_block) - 1)
            assert n == (layers - 1) + layers * (1 + inside), (row_block, step)


def test_no_row_blocks_where_a_row_would_depend_on_them(tiny_llama_d64_dir):
    """float32 weights unpinned: chunks over PACKED_FLOAT_MAX_ROWS rows use torch's GEMM, whose
    rows may depend on the row count; the ops run whole, pausing at layer boundaries only."""
    loaded = load_model(tiny_llama_d64_dir, dtype=torch.float32, device="cpu")
    loaded.model.set_decode_weight_format("float32")
    base_hidden, base_kv, _, _ = _run(loaded.model, loaded.config, 0)
    hidden, kv, calls, split = _run(loaded.model, loaded.config, 16)
    assert not split
    assert torch.equal(hidden, base_hidden) and torch.equal(kv, base_kv)
    layers = loaded.config.num_layers
    assert calls == [2 * layers - 1] * len(PREFILL)
