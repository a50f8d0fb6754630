"""Rope variants: inverse frequencies and amplitude equal transformers' modeling_rope_utils,
per-position choices for the length-dependent variants, partial rotary."""

from __future__ import annotations

import pytest
import torch

from cadence.model.config import RopeScaling
from cadence.model.rope import RotaryEmbedding, apply_rope, inverse_frequencies

HEAD_DIM, MAX_POS = 64, 512

VARIANTS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn_mscale": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, mscale=0.7,
                        mscale_all_dim=0.5, beta_fast=16.0, beta_slow=2.0, truncate=False),
    "longrope": dict(rope_type="longrope", original_max_position_embeddings=64,
                     short_factor=[1.0 + 0.1 * i for i in range(32)],
                     long_factor=[2.0 + 0.2 * i for i in range(32)]),
}


def hf_config(params: dict, partial: float):
    import transformers

    config = transformers.LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, head_dim=HEAD_DIM,
                                      max_position_embeddings=MAX_POS,
                                      rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": partial,
                                                       **params})
    return config


def ours(params: dict) -> RopeScaling:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    return RopeScaling(**fields)


@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("seq_len", [None, 100, 2000])
def test_inverse_frequencies_match_transformers(name, partial, seq_len):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(VARIANTS[name])
    dim = int(HEAD_DIM * partial)
    if name == "longrope":
        params["short_factor"] = params["short_factor"][:dim // 2]
        params["long_factor"] = params["long_factor"][:dim // 2]
    expected, expected_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_config(params, partial), "cpu",
                                                                          seq_len=seq_len)
    got, factor = inverse_frequencies(ours(params), 10000.0, dim, MAX_POS, seq_len=seq_len)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)


def test_dynamic_and_longrope_decide_per_position():
    """Within the original length they are the plain (short) frequencies, whatever else is in
    the batch; past it each position gets the frequencies of a sequence ending there."""
    for name, switch in (("dynamic", MAX_POS), ("longrope", 64)):
        scaling = ours(VARIANTS[name])
        rope = RotaryEmbedding(10000.0, HEAD_DIM, MAX_POS, scaling)
        positions = torch.tensor([3, switch - 1, switch, switch + 700])
        cos, sin = rope.cos_sin(positions, torch.float32)
        alone = [rope.cos_sin(positions[i:i + 1], torch.float32) for i in range(4)]
        for i in range(4):  # a position's row does not depend on its batch
            torch.testing.assert_close(cos[i:i + 1], alone[i][0], rtol=0, atol=0)
        for i, p in enumerate(positions.tolist()):
            inv, amp = inverse_frequencies(scaling, 10000.0, HEAD_DIM, MAX_POS, seq_len=p + 1)
            angles = p * inv
            torch.testing.assert_close(sin[i], torch.cat((angles, angles)).sin() * amp)
        short, _ = inverse_frequencies(scaling, 10000.0, HEAD_DIM, MAX_POS)
        assert torch.equal(inverse_frequencies(scaling, 10000.0, HEAD_DIM, MAX_POS, seq_len=switch)[0], short)
        assert not torch.equal(inverse_frequencies(scaling, 10000.0, HEAD_DIM, MAX_POS, seq_len=switch + 1)[0],
                               short)


def test_partial_rotary_passes_the_rest_through():
    x = torch.randn(5, 3, 16)
    rope = RotaryEmbedding(10000.0, 12, MAX_POS)
    cos, sin = rope.cos_sin(torch.arange(5) + 7, torch.float32)
    assert cos.shape == (5, 12)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[..., 12:], x[..., 12:])
    full = apply_rope(x[..., :12], cos, sin)
    torch.testing.assert_close(out[..., :12], full)
    assert not torch.allclose(out[..., :12], x[..., :12])


@pytest.mark.parametrize("name", [None, *sorted(VARIANTS)])
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 48])
def test_table_rows_are_the_computed_rows(name, rotary_dim):
    """cos_sin with `end` reads a table of rows (grown as positions reach them): bit for bit the
    rows computed from the positions, in any batch, for every variant; past a length-dependent
    variant's switch the rows are computed."""
    if name == "longrope" and rotary_dim != HEAD_DIM:
        pytest.skip("longrope's factors are given per frequency of HEAD_DIM")
    scaling = ours(VARIANTS[name]) if name else None
    rope = RotaryEmbedding(10000.0, rotary_dim, MAX_POS, scaling)
    g = torch.Generator().manual_seed(0)
    for num, high in ((1, MAX_POS), (3, 64), (8, MAX_POS), (8, 64), (40, MAX_POS), (300, MAX_POS)):
        positions = torch.randint(0, high, (num,), generator=g)  # below 64: longrope's switch
        end = int(positions.max()) + 1
        for dtype in (torch.float32, torch.bfloat16):
            computed = rope.cos_sin(positions, dtype)
            tabled = rope.cos_sin(positions, dtype, end)
            assert torch.equal(tabled[0], computed[0]) and torch.equal(tabled[1], computed[1])
            assert tabled[0].shape == (num, rotary_dim) and tabled[0].is_contiguous()
    tables = rope._tables
    assert tables and all(cos.shape[0] <= MAX_POS for cos, _ in tables.values())
