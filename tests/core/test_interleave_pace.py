"""--core-split interleave's pace and chunk size (core/interleave_pace.py)."""

from __future__ import annotations

import pytest

from cadence.core.interleave_pace import (DECODE_SHARE, MIN_ROW_BLOCK, PACE_CAP, ROW_BLOCK, SEGMENT_SHARE,
                                          interleave_chunk_tokens, interleave_pace_s, interleave_row_block)


def test_the_pace_keeps_decode_steps_to_their_share_of_the_prefill():
    step = 0.006
    pace = interleave_pace_s(step, target_itl_s=0.1)
    # Between two steps' starts: one step, then the prefill's time for which it is the share.
    assert pace - step == pytest.approx(step / DECODE_SHARE)
    # A slower step, a longer pace; never past the cap of the ITL target.
    assert interleave_pace_s(2 * step, 0.1) > pace
    assert interleave_pace_s(1.0, 0.1) == pytest.approx(PACE_CAP * 0.1)
    # Not measured yet: the cap.
    assert interleave_pace_s(None, 0.1) == pytest.approx(PACE_CAP * 0.1)


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
