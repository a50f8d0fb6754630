"""Which streams count as interfered by a long prefill."""

from __future__ import annotations

import pytest

from cadence.bench.interference import gaps_in_windows, interference_metrics, is_interfered, prefill_windows
from cadence.bench.records import Failure

from .records_factory import make_record

LONG = 1000


def _long(index, send, first, end=None, failure=None):
    chunks = [(first, 1)] if first is not None else []
    return make_record(index, send, chunks, end=end or (first or send) + 0.1, prompt_tokens=2000,
                       failure=failure, kind="document")


def test_window_is_send_to_first_token():
    doc = _long(9, send=1.0, first=2.0)
    assert [(w.start, w.end) for w in prefill_windows([doc], LONG)] == [(1.0, 2.0)]


def test_long_request_failing_before_first_token_window_ends_at_its_end():
    doc = _long(9, send=1.0, first=None, end=1.7, failure=Failure("http", "too long", 400))
    assert [(w.start, w.end) for w in prefill_windows([doc], LONG)] == [(1.0, 1.7)]


@pytest.mark.parametrize(
    "first, end, expected",
    [
        (0.5, 1.5, True),    # decoding when the window [1, 2] opened
        (1.2, 3.0, True),    # first token inside the window, still decoding
        (0.5, 3.0, True),    # spans the whole window
        (0.2, 0.9, False),   # finished before the window
        (2.5, 3.0, False),   # first token only after the window closed
        (0.5, 1.0, False),   # finished exactly as the window opened: touching is not overlap
        (2.0, 3.0, False),   # first token exactly as the window closed
    ],
)
def test_classification(first, end, expected):
    doc = _long(9, send=1.0, first=2.0)
    chat = make_record(0, 0.0, [(first, 1), (end, 1)], end=end)
    assert is_interfered(chat, prefill_windows([doc], LONG)) is expected


def test_long_request_is_not_interfered_by_its_own_window_but_by_another():
    a = _long(1, send=1.0, first=2.0, end=4.0)
    b = _long(2, send=3.0, first=3.5)
    windows = prefill_windows([a, b], LONG)
    assert is_interfered(a, windows)          # a decodes during b's window [3, 3.5]
    assert not is_interfered(b, windows)      # b's own window does not count


def test_metrics_split_itl_and_gaps_inside_windows():
    doc = _long(9, send=1.0, first=2.0)
    stalled = make_record(0, 0.0, [(0.5, 1), (0.6, 1), (2.1, 1), (2.2, 1)], end=2.2)
    calm = make_record(1, 3.0, [(3.1, 1), (3.2, 1), (3.25, 1)], end=3.3)
    m = interference_metrics([doc, stalled, calm], LONG)
    assert m["interfered_requests"] == [0]
    assert m["itl_interfered"]["count"] == 3 and m["itl_interfered"]["max"] == pytest.approx(1.5)
    assert m["itl_other"]["count"] == 2 and m["itl_other"]["max"] == pytest.approx(0.1)
    assert gaps_in_windows(stalled, prefill_windows([doc], LONG)) == pytest.approx([1.5])
    assert m["itl_in_windows"]["count"] == 1
    assert m["ttft_long"]["count"] == 1 and m["ttft_long"]["p50"] == pytest.approx(1.0)
    assert m["ttft_short"]["count"] == 2


def test_no_long_request_means_nothing_interfered():
    recs = [make_record(i, 0.0, [(0.1, 1), (0.2, 1)]) for i in range(3)]
    m = interference_metrics(recs, LONG)
    assert m["windows"] == [] and m["interfered_requests"] == []
    assert m["itl_interfered"]["count"] == 0 and m["itl_other"]["count"] == 3
