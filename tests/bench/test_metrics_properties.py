"""Properties of the ITL/TTFT/TPOT formulas over random chunk timelines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.bench.metrics import e2e, itl_gaps, tpot, ttft

from .records_factory import make_record

chunk_lists = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=0.5), st.integers(min_value=1, max_value=4)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(send=st.floats(min_value=0.0, max_value=10.0), first_delay=st.floats(min_value=0.0, max_value=5.0),
       chunks=chunk_lists)
def test_gaps_telescope_and_count_every_token(send, first_delay, chunks):
    t, timeline = send + first_delay, []
    for delta, k in chunks:
        t += delta
        timeline.append((t, k))
    rec = make_record(0, send, timeline)
    tokens = sum(k for _, k in chunks)
    gaps = itl_gaps(rec)
    assert len(gaps) == tokens - 1                      # first token excluded, k-1 zeros per chunk
    assert all(g >= 0 for g in gaps)
    assert sum(gaps) == pytest.approx(timeline[-1][0] - timeline[0][0], abs=1e-9)
    assert ttft(rec) == pytest.approx(timeline[0][0] - send)
    assert sum(1 for g in gaps if g == 0) >= sum(k - 1 for _, k in chunks)
    if tokens > 1:
        # E2E ends at the last chunk here, so TPOT is the mean gap.
        assert tpot(rec) == pytest.approx((e2e(rec) - ttft(rec)) / (tokens - 1))
        assert tpot(rec) == pytest.approx(sum(gaps) / len(gaps), abs=1e-9)
