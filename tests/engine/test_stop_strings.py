"""StopStringMatcher: exact cuts, hold-back of possible starts, any split of the stream."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.engine.stop_strings import StopStringMatcher


def stream(pieces, stop):
    m = StopStringMatcher(stop)
    out = []
    for p in pieces:
        out.append(m.feed(p))
        if m.stopped:
            break
    if not m.stopped:
        out.append(m.flush())
    return "".join(out), m.stopped


def reference(text, stop):
    """Cut before the stop string that completes first (earliest end, then earliest start)."""
    matches = [(text.find(s) + len(s), text.find(s)) for s in stop if s in text]
    return (text[: min(matches)[1]], True) if matches else (text, False)


def test_cut_exactly_before_stop_string():
    assert stream(["Hello wor", "ld. Bye"], ["world"]) == ("Hello ", True)


def test_possible_start_is_held_then_released():
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc ST") == "abc "
    assert m.held_text == "ST"
    assert m.feed("ART") == "START"  # "STA" is not a prefix of STOP: released
    assert not m.stopped


def test_held_text_released_at_end_of_stream():
    m = StopStringMatcher(["\n\n"])
    assert m.feed("line\n") == "line"
    assert m.flush() == "\n"


def test_earliest_of_several_stop_strings_wins():
    assert stream(["a b c d"], ["d", "b"]) == ("a ", True)


def test_first_completed_stop_string_wins_whatever_the_split():
    # "a" completes before "\naa" does, so generation would already have stopped there.
    assert stream(["\naa"], ["a", "\naa"]) == ("\n", True)
    assert stream(["\na", "a"], ["a", "\naa"]) == ("\n", True)


def test_no_stop_strings_passes_through():
    m = StopStringMatcher([])
    assert m.feed("anything") == "anything" and m.flush() == ""


def test_rejects_empty_stop_string():
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher([""])


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=30),
    stop=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8),
)
def test_any_split_matches_reference(text, stop, cuts):
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert stream(pieces, stop) == reference(text, stop)
