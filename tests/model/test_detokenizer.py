"""IncrementalDetokenizer: never half a character; all pushes + flush == one-shot decode."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.model.detokenizer import IncrementalDetokenizer

from .test_tokenizer import TEXTS


def stream(tokenizer, ids, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_one_shot(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    pieces, rest = stream(tiny_tokenizer, ids)
    assert "".join(pieces) == text and rest == ""
    assert all("\ufffd" not in p for p in pieces)  # no half characters on the way


def test_emoji_is_held_until_complete(tiny_tokenizer):
    ids = tiny_tokenizer.encode("😀")
    assert len(ids) > 1  # the tiny vocab splits it into bytes
    pieces, _ = stream(tiny_tokenizer, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "😀"


def test_truncated_character_comes_out_on_flush(tiny_tokenizer):
    ids = tiny_tokenizer.encode("ok 😀")[:-1]  # stop mid-emoji
    pieces, rest = stream(tiny_tokenizer, ids)
    assert "".join(pieces) + rest == tiny_tokenizer.decode(ids)
    assert rest.endswith("\ufffd")


def test_special_tokens_skipped_or_kept(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<|im_start|>hi<|im_end|>")
    assert "".join(stream(tiny_tokenizer, ids)[0]) == "hi"
    assert "".join(stream(tiny_tokenizer, ids, False)[0]) == "<|im_start|>hi<|im_end|>"


def test_bad_id_is_rejected_without_corrupting_state(tiny_tokenizer):
    detok = IncrementalDetokenizer(tiny_tokenizer)
    with pytest.raises(ValueError):
        detok.push(10**9)
    assert detok.token_ids == []


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_id_sequence_streams_to_its_decode(tiny_tokenizer, data):
    ids = data.draw(st.lists(st.integers(0, tiny_tokenizer.vocab_size - 1), max_size=40))
    pieces, rest = stream(tiny_tokenizer, ids)
    assert "".join(pieces) + rest == tiny_tokenizer.decode(ids)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40))
def test_any_text_streams_back(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    pieces, rest = stream(tiny_tokenizer, ids)
    assert "".join(pieces) + rest == tiny_tokenizer.decode(ids)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_gguf_streamed_text_equals_one_shot(default_tokenizer, text):
    ids = default_tokenizer.encode(text)
    pieces, rest = stream(default_tokenizer, ids)
    assert "".join(pieces) == text and rest == ""
