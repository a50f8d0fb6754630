"""Tokenizer: round trips, special tokens, chat template, agreement with transformers."""

from __future__ import annotations

import pytest

from cadence.model.tokenizer import Tokenizer, TokenizerError

TEXTS = [
    "Hello world! How are you today?",
    "emoji 😀👍🏽 and family 👨‍👩‍👧",
    "中文字符, 日本語のテキスト, 한국어",
    "tabs\tand\nnewlines  and   spaces ",
    "numbers 12345 and 3.14159, dates 2024-01-01",
    "accents: héllo, naïve, façade",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_round_trip(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def test_tiny_matches_transformers(tiny_llama_dir, tiny_tokenizer):
    import transformers

    theirs = transformers.AutoTokenizer.from_pretrained(tiny_llama_dir)
    for text in TEXTS:
        assert tiny_tokenizer.encode(text) == theirs(text)["input_ids"], text
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "more?"}]
    assert tiny_tokenizer.apply_chat_template(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_tiny_special_tokens_and_stops(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tiny_tokenizer.decode(ids) == "user\nhi"
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tiny_tokenizer.eos_token_id == 2
    assert tiny_tokenizer.stop_token_ids[0] == 2 and 0 in tiny_tokenizer.stop_token_ids


def test_bad_input_gives_clear_errors(tiny_tokenizer, tmp_path):
    with pytest.raises(TokenizerError, match="expects str"):
        tiny_tokenizer.encode(None)
    with pytest.raises(TokenizerError, match="outside"):
        tiny_tokenizer.decode([tiny_tokenizer.vocab_size])
    with pytest.raises(TokenizerError, match="outside"):
        tiny_tokenizer.decode([-1])
    with pytest.raises(ValueError, match="non-empty list"):
        tiny_tokenizer.apply_chat_template([])
    with pytest.raises(ValueError, match="'role'"):
        tiny_tokenizer.apply_chat_template([{"content": "no role"}])
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(str(tmp_path))


def test_template_raise_exception_is_a_value_error(tiny_llama_dir):
    from tokenizers import Tokenizer as Backend

    backend = Backend.from_file(f"{tiny_llama_dir}/tokenizer.json")
    strict = Tokenizer(backend, eos_token_id=2,
                       chat_template="{{ raise_exception('only users may speak') }}")
    with pytest.raises(ValueError, match="only users may speak"):
        strict.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer(backend, eos_token_id=2).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_gguf_round_trip(default_tokenizer, text):
    assert default_tokenizer.decode(default_tokenizer.encode(text)) == text


@pytest.mark.slow
def test_gguf_tokenizer_metadata(default_tokenizer):
    assert default_tokenizer.vocab_size == 49152
    assert default_tokenizer.eos_token_id == 2 and default_tokenizer.bos_token_id == 1
    assert default_tokenizer.stop_token_ids == (2, 0)  # <|im_end|>, <|endoftext|>
    assert default_tokenizer.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    prompt = default_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_gguf_ids_match_transformers(default_model_path, default_tokenizer):
    import os

    import transformers

    theirs = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(default_model_path), gguf_file=os.path.basename(default_model_path))
    for text in TEXTS + ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n"]:
        assert default_tokenizer.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert default_tokenizer.apply_chat_template(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_numpy_ids_accepted_floats_rejected(tiny_tokenizer):
    import numpy as np

    ids = tiny_tokenizer.encode("Hello world")
    assert tiny_tokenizer.decode(np.array(ids)) == "Hello world"
    with pytest.raises(TokenizerError, match="outside"):
        tiny_tokenizer.decode([1.5])


def test_padded_model_vocab_ids_decode_to_nothing(tiny_llama_dir):
    tok = Tokenizer.from_hf_dir(tiny_llama_dir, vocab_size=512)
    assert tok.vocab_size == 512
    assert tok.decode([tok.encode("Hi")[0], 450]) == tok.decode(tok.encode("Hi")[:1])
