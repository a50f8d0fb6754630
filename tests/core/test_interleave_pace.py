"""--core-split interleave's pace and chunk size (core/interleave_pace.py)."""

from __future__ import annotations

import pytest

from cadence.core.interleave_pace import (BOUND_SHARE, DECODE_SHARE, MIN_ROW_BLOCK, PACE_CAP, ROW_BLOCK, SEGMENT_SHARE,
                                          interleave_chunk_tokens, interleave_pace_s, interleave_row_block)


def _share(step: float, pace: float) -> float:
    """Decode seconds per second of prefill at this pace."""
    return step / (pace - step)


def test_a_fast_step_takes_the_decode_share_the_bound_allows():
    step = 0.006  # SmolLM2's 3-row step: the 80 ms target is met at any share here
    pace = interleave_pace_s(step, target_itl_s=0.1, max_prefill_slowdown=1.15)
    # The default bound's share (0.12) is below DECODE_SHARE: the bound sets it.
    assert _share(step, pace) == pytest.approx(BOUND_SHARE * 0.15)
    assert pace <= PACE_CAP * 0.1
    # A looser bound: DECODE_SHARE, no more (the target needs less).
    loose = interleave_pace_s(step, 0.1, max_prefill_slowdown=2.0)
    assert _share(step, loose) == pytest.approx(DECODE_SHARE)
    assert loose < pace
    # A slower step, a longer pace.
    assert interleave_pace_s(2 * step, 0.1, 2.0) > loose


def test_the_target_shortens_the_pace_while_the_bound_holds():
    step = 0.02  # at DECODE_SHARE the pace would be 153 ms, past the 80 ms cap
    pace = interleave_pace_s(step, 0.1, max_prefill_slowdown=1.5)  # shares up to 0.4
    assert pace == pytest.approx(PACE_CAP * 0.1)
    assert DECODE_SHARE < _share(step, pace) <= BOUND_SHARE * 0.5


def test_a_slow_step_keeps_the_bound_and_misses_the_target():
    step = 0.027  # the 1B shape's 3-row step on 2 cores
    pace = interleave_pace_s(step, 0.1, max_prefill_slowdown=1.15)
    # The target's share would be 0.51 (a 1.5x slower document): the bound's share instead,
    # a pace past the target (the reachable gap the engine reports).
    assert _share(step, pace) == pytest.approx(BOUND_SHARE * 0.15)
    assert pace > 0.1
    # Never a share past the bound, however slow the step or tight the target.
    for step_s in (0.001, 0.01, 0.05, 0.2, 1.0):
        for target in (0.02, 0.1, 1.0):
            for slowdown in (1.05, 1.15, 1.5):
                pace = interleave_pace_s(step_s, target, slowdown)
                assert _share(step_s, pace) <= BOUND_SHARE * (slowdown - 1) * (1 + 1e-9)
    # Not measured yet: the target's cap.
    assert interleave_pace_s(None, 0.1, 1.15) == pytest.approx(PACE_CAP * 0.1)


def test_the_chunk_is_the_largest_whose_layer_segment_fits_the_pace():
    pace = 0.04
    per_token = 5e-6  # seconds of the longest segment per chunk token
    tokens = interleave_chunk_tokens(per_token, pace, first=512, budget=2048)
    assert tokens == int(SEGMENT_SHARE * pace / per_token)
    assert tokens * per_token <= SEGMENT_SHARE * pace
    # Short segments: the step's budget; long ones: never below the first chunk's size.
    assert interleave_chunk_tokens(1e-9, pace, 512, 2048) == 2048
    assert interleave_chunk_tokens(1.0, pace, 512, 2048) == 512
    # Before any measurement: the first chunk (within the budget).
    assert interleave_chunk_tokens(None, pace, 512, 2048) == 512
    assert interleave_chunk_tokens(None, pace, 512, 256) == 256
    # A model that pauses between row blocks: the segment bounds nothing, the chunk is the budget.
    assert interleave_chunk_tokens(1.0, pace, 512, 2048, rows_split=True) == 2048


def test_the_row_block_is_the_largest_whose_piece_fits_the_pace():
    pace = 0.04
    per_row = 5e-5  # seconds of the longest row block's op piece per row
    rows = interleave_row_block(per_row, pace, budget=2048)
    assert rows == int(SEGMENT_SHARE * pace / per_row) and rows * per_row <= SEGMENT_SHARE * pace
    # Before a measurement ROW_BLOCK; never under MIN_ROW_BLOCK nor over the budget.
    assert interleave_row_block(None, pace, 2048) == ROW_BLOCK
    assert interleave_row_block(1.0, pace, 2048) == MIN_ROW_BLOCK
    assert interleave_row_block(1e-9, pace, 2048) == 2048
