"""vLLM's truncate_prompt_tokens (core/prompt_truncation.py): left truncation, -1, bounds."""

from __future__ import annotations

import pytest

from cadence.core.prompt_truncation import truncate_prompt


def test_keeps_the_last_k_tokens():
    ids = list(range(10))
    assert truncate_prompt(ids, 3, 100, 16) == [7, 8, 9]
    assert truncate_prompt(ids, 50, 100, 16) == ids  # shorter than k: unchanged
    assert truncate_prompt(ids, None, 5, 16) == ids  # no truncation asked: no bound either
    assert truncate_prompt(ids, 3, 100, 16, side="right") == [0, 1, 2]  # vLLM's truncation_side
    with pytest.raises(ValueError, match="truncation_side"):
        truncate_prompt(ids, 3, 100, 16, side="middle")


def test_minus_one_is_what_the_context_leaves_beside_max_tokens():
    ids = list(range(600))
    assert truncate_prompt(ids, -1, 512, 16) == ids[-(512 - 16):]
    assert truncate_prompt(ids, -1, 512, None) == ids[-511:]  # room for one output token


def test_out_of_range_values_are_refused():
    with pytest.raises(ValueError, match=r"truncate_prompt_tokens=497 .* = 496"):
        truncate_prompt([1, 2], 497, 512, 16)  # refused whatever the prompt's length (vLLM)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="truncate_prompt_tokens must be >= 1 or -1"):
            truncate_prompt([1, 2], bad, 512, 16)
