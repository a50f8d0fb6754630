"""Tokenizers rebuilt from GGUF metadata encode as llama.cpp does: SentencePiece-style "llama"
vocabularies (tiny one built here against a port of llama.cpp's algorithm; Gemma 3's real one
against llama.cpp's llama-tokenize), BPE pre-tokenizers by name, BOS as the file says, and a
clear error for what is not supported."""

from __future__ import annotations

import ast
import os
import subprocess
from collections import Counter

import gguf
import pytest

from cadence.model.gguf_fields import GGUFFile
from cadence.model.gguf_pretokenizers import SUPPORTED_PRE_TOKENIZERS, pre_tokenizer_spec
from cadence.model.gguf_tokenizer import tokenizer_from_gguf
from cadence.model.tokenizer import TokenizerError

from .spm_reference import llama_cpp_spm_encode

SPACE = "\u2581"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Hello world! How are you today? I am fine, thank you.",
    "def forward(self, x): return self.norm(x + self.attn(x))",
]
TEXTS = CORPUS + [
    "", " ", "  two  spaces ", "\n\nnew lines\n", "émigré 😀 日本",  # é, 😀, 日本: bytes only
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "the the theme thematic",
    "keys  and\tvalues", "<bos>x<eos>", "a" * 40,
]


def _tiny_spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """Control tokens, 256 byte tokens, two user-defined ones, then pieces: every substring of
    up to 5 characters of the escaped corpus, scored by frequency (no 'é', emoji or CJK)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    tokens += ["\n\n", "  "]
    types += [4, 4]
    counts: Counter[str] = Counter()
    for line in CORPUS:
        text = SPACE + line.replace(" ", SPACE)
        for size in range(1, 6):
            counts.update(text[i:i + size] for i in range(len(text) - size + 1))
    pieces = [p for p, n in counts.most_common() if n > 1 or len(p) == 1]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, types + [1] * len(pieces)


def _write_vocab(path: str, tokens, scores, types, **flags) -> str:
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    if "add_space_prefix" in flags:
        writer.add_add_space_prefix(flags["add_space_prefix"])
    if "add_bos" in flags:
        writer.add_add_bos_token(flags["add_bos"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("add_space_prefix", [False, True])
def test_spm_vocab_encodes_like_llama_cpp(tmp_path, add_space_prefix):
    tokens, scores, types = _tiny_spm_vocab()
    path = _write_vocab(str(tmp_path / "v.gguf"), tokens, scores, types, add_space_prefix=add_space_prefix)
    tok = tokenizer_from_gguf(GGUFFile(path))
    for text in TEXTS:
        expected = llama_cpp_spm_encode(text, tokens, scores, types, add_space_prefix, bos_id=2)
        assert tok.encode(text) == expected, text
        # Decoding gives the text back (special tokens kept), less the prefix space llama.cpp
        # adds at the start; the one it adds after an added token stays (llama.cpp's too).
        if not add_space_prefix or text in CORPUS:
            assert tok.decode(expected[1:], skip_special_tokens=False) == text, text
    assert tok.encode("hello", add_special_tokens=False)[0] != 2
    assert len(tok.encode("é")) == 1 + 2 + int(add_space_prefix)  # BOS, two UTF-8 bytes


def test_spm_bos_as_the_file_says(tmp_path):
    tokens, scores, types = _tiny_spm_vocab()
    path = _write_vocab(str(tmp_path / "v.gguf"), tokens, scores, types, add_bos=False)
    assert tokenizer_from_gguf(GGUFFile(path)).encode("the")[0] != 2


def test_end_of_turn_ids_from_the_file_stop_generation(tmp_path):
    tokens, scores, types = _tiny_spm_vocab()
    path = _write_vocab(str(tmp_path / "v.gguf"), tokens, scores, types)
    reader = GGUFFile(path)
    assert tokenizer_from_gguf(reader).stop_token_ids == (1, 5)  # <eos>, <end_of_turn> by name
    reader.fields["tokenizer.ggml.eot_token_id"] = 4  # a file naming <start_of_turn> (odd, but said)
    reader.fields["tokenizer.ggml.eom_token_id"] = 10**6  # outside the vocabulary: ignored
    assert tokenizer_from_gguf(reader).stop_token_ids == (1, 4, 5)


def test_unknown_vocabulary_model_or_pre_tokenizer_is_an_error(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "t5.gguf"), "llama")
    writer.add_tokenizer_model("t5")
    writer.add_token_list(["a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match=r"model 't5' is not supported \(supported: gpt2, llama\)"):
        tokenizer_from_gguf(GGUFFile(str(tmp_path / "t5.gguf")))
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("chameleon")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match=r"pre-tokenizer 'chameleon' is not supported \(supported: .*llama-bpe.*qwen2.*smollm"):
        tokenizer_from_gguf(GGUFFile(str(tmp_path / "odd.gguf")))


@pytest.mark.parametrize("pre, pieces", [
    ("llama-bpe", ["Hello", "Ġworld", "Ġ", "123", "45", "!"]),
    ("qwen2", ["Hello", "Ġworld", "Ġ", "1", "2", "3", "4", "5", "!"]),
    ("smollm", ["Hello", "Ġworld", "Ġ", "1", "2", "3", "4", "5", "!"]),
    ("gpt-2", ["Hello", "Ġworld", "Ġ12345", "!"]),
    ("default", ["Hello", "Ġworld", "Ġ", "123", "45", "!"]),
])
def test_bpe_pre_tokenizers_split_like_llama_cpp(tiny_llama_dir, tmp_path, pre, pieces):
    from .gguf_helpers import write_tiny_gguf

    path = write_tiny_gguf(tiny_llama_dir, str(tmp_path / f"{pre}.gguf"), pre=pre)
    tok = tokenizer_from_gguf(GGUFFile(path))
    assert [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("Hello world 12345!")] == pieces
    assert tok.decode(tok.encode("Hello world 12345!")) == "Hello world 12345!"
    # Llama 3's vocabularies add BOS by default (none here: the tiny file has no BOS id).
    assert pre in SUPPORTED_PRE_TOKENIZERS


LLAMA_TOKENIZE = "/work/cache/llamacpp/build/bin/llama-tokenize"
BPE_TEXTS = [
    "Hello world 12345!", "I'm sure they'LL say DON'T", "  two  spaces\n\n\tand tabs  ",
    "naïve café ñandú", "日本語のテキスト, 中文。", "emoji 😀👍🏽 done", "camelCaseWord HTTPServer",
    "x = [1, 2, 3]; y == 3.14159!!!", "line\r\nbreaks\n\n\n", "    indented\n        more", "$100 + <tag>|~^",
]


def llama_cpp_ids(path: str, text: str) -> list[int]:
    """llama.cpp's own tokenization of `text` with the vocabulary in `path` (special tokens parsed,
    BOS as the file says)."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(LLAMA_TOKENIZE))
    run = subprocess.run([LLAMA_TOKENIZE, "-m", path, "--stdin", "--ids", "--log-disable"],
                         input=text.encode(), capture_output=True, env=env, timeout=120, check=True)
    return ast.literal_eval(run.stdout.decode().strip().splitlines()[-1])


def _needs_llama_tokenize() -> None:
    if not os.access(LLAMA_TOKENIZE, os.X_OK):
        pytest.skip("llama.cpp's llama-tokenize is not built here")


def _vocab_only_file(path: str, fill) -> str:
    """A GGUF that llama.cpp loads vocab-only: a llama architecture's required keys, no tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_layer_norm_rms_eps(1e-5)
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("add_space_prefix", [False, True])
def test_spm_vocab_encodes_as_llama_cpp_itself(tmp_path, add_space_prefix):
    _needs_llama_tokenize()
    tokens, scores, types = _tiny_spm_vocab()

    def fill(writer):
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(3)
        writer.add_add_space_prefix(add_space_prefix)

    path = _vocab_only_file(str(tmp_path / "spm.gguf"), fill)
    tok = tokenizer_from_gguf(GGUFFile(path))
    for text in TEXTS + BPE_TEXTS:
        if text:  # llama-tokenize reads an empty stdin as no prompt
            assert tok.encode(text) == llama_cpp_ids(path, text), text


def _one_name_per_spec() -> list[str]:
    # llama.cpp's names (not cadence's "gpt2" alias), one per distinct regex chain and defaults.
    seen, names = set(), []
    for name in SUPPORTED_PRE_TOKENIZERS:
        spec = pre_tokenizer_spec(name)
        if name != "gpt2" and spec not in seen:
            seen.add(spec)
            names.append(name)
    return names


LLAMA_CPP_PRE_NAMES = _one_name_per_spec()


@pytest.mark.parametrize("pre", LLAMA_CPP_PRE_NAMES)
def test_bpe_pre_tokenizers_encode_as_llama_cpp_itself(tiny_llama_dir, tmp_path, pre):
    _needs_llama_tokenize()
    from .gguf_helpers import _write_bpe_vocab

    def fill(writer):
        _write_bpe_vocab(writer, tiny_llama_dir, pre)
        writer.add_bos_token_id(0)  # llama.cpp adds BOS by default for some names (llama-bpe, tekken)

    path = _vocab_only_file(str(tmp_path / f"{pre}.gguf"), fill)
    tok = tokenizer_from_gguf(GGUFFile(path))
    for text in BPE_TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text) == llama_cpp_ids(path, text), (pre, text)


GEMMA3_FILE = "/work/cache/gemma/gemma-3-270m-q4_k_m.gguf"
# llama-tokenize -m gemma-3-270m-q4_k_m.gguf --stdin --ids (llama.cpp 0.3.36's vendored build).
GEMMA3_EXPECTED = {
    "Hello world! How are you?": [2, 9259, 1902, 236888, 2088, 659, 611, 236881],
}
GEMMA3_TEXTS = [
    "Hello world! How are you?",
    "  leading spaces and\n\nnewlines\ttabs   trailing  ",
    "日本語のテキスト 😀 émigré naïve façade",
    "<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x ** 2  # square\n",
    "1234567890 3.14159 -42 1e-6",
    "Ünïcödé ﬁ ligature Ω ≈ ∑ \u200b zero width",
]


@pytest.fixture(scope="module")
def gemma3_tokenizer():
    if not os.path.isfile(GEMMA3_FILE):
        pytest.skip(f"{GEMMA3_FILE} is only on the development machine")
    return tokenizer_from_gguf(GGUFFile(GEMMA3_FILE))


def test_gemma3_file_tokenizer_matches_recorded_llama_cpp_ids(gemma3_tokenizer):
    assert gemma3_tokenizer.vocab_size == 262144 and gemma3_tokenizer.bos_token_id == 2
    for text, ids in GEMMA3_EXPECTED.items():
        assert gemma3_tokenizer.encode(text) == ids
        assert gemma3_tokenizer.decode(ids) == text
    assert 106 in gemma3_tokenizer.stop_token_ids  # <end_of_turn>


def test_gemma3_file_tokenizer_matches_llama_tokenize(gemma3_tokenizer):
    _needs_llama_tokenize()
    for text in GEMMA3_TEXTS + BPE_TEXTS[:4]:
        expected = llama_cpp_ids(GEMMA3_FILE, text)
        assert gemma3_tokenizer.encode(text) == expected, text
        assert gemma3_tokenizer.decode(expected[1:], skip_special_tokens=False) == text, text


def test_merges_of_unknown_tokens_are_a_tokenizer_error(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(["a", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match="inconsistent.*`b` out of vocabulary"):
        tokenizer_from_gguf(GGUFFile(str(tmp_path / "bad.gguf")))
