"""Build a Tokenizer from the tokenizer a GGUF file describes in its metadata.

llama.cpp stores a byte-level BPE ("gpt2" model) as its vocabulary (already spelled in the GPT-2
byte alphabet), its merges, a token type per id and the name of the pre-tokenizer regex the
vocabulary was trained with. We rebuild the equivalent `tokenizers` pipeline.
"""

from __future__ import annotations

import logging

import gguf
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from cadence.model.gguf_fields import GGUFFile, gguf_value
from cadence.model.tokenizer import Tokenizer, TokenizerError

logger = logging.getLogger(__name__)

# llama_token_type values in tokenizer.ggml.token_type.
_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre_tokenizers.PreTokenizer:
    # The GPT-2 regex plus byte-to-unicode mapping, no leading space added.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def pre_tokenizer_for(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer matching llama.cpp's `tokenizer.ggml.pre` name."""
    if pre in (None, "default", "gpt2", "gpt-2"):
        return _byte_level()
    if pre == "smollm":
        # SmolLM's tokenizer.json: every digit on its own, then the GPT-2 regex (llama.cpp's
        # LLAMA_VOCAB_PRE_TYPE_SMOLLM is the same pair of regexes).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])
    if pre in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"):
        return _split_then_bytes(_LLAMA3_SPLIT)
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(_QWEN2_SPLIT)
    logger.warning("unknown GGUF pre-tokenizer %r: using the GPT-2 regex", pre)
    return _byte_level()


def tokenizer_from_gguf(reader: GGUFFile | gguf.GGUFReader) -> Tokenizer:
    """Rebuild the model's tokenizer and chat template from GGUF metadata."""
    model_type = gguf_value(reader, "tokenizer.ggml.model", None)
    if model_type != "gpt2":
        raise TokenizerError(
            f"GGUF tokenizer model {model_type!r} is not supported (only byte-level BPE 'gpt2')"
        )
    try:
        tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
        merges: list[str] = gguf_value(reader, "tokenizer.ggml.merges")
    except KeyError as exc:
        raise TokenizerError(f"GGUF tokenizer metadata incomplete: {exc}") from exc
    token_types: list[int] = gguf_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))

    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise TokenizerError(f"malformed GGUF merge {merge!r}")
        pairs.append((left, right))
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizer_for(gguf_value(reader, "tokenizer.ggml.pre", None))
    backend.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|> ...) must be matched whole in text and skipped when decoding;
    # user-defined ones are matched whole but kept in the output text.
    backend.add_special_tokens([
        AddedToken(tok, special=True, normalized=False)
        for tok, kind in zip(tokens, token_types) if kind == _CONTROL
    ])
    backend.add_tokens([
        AddedToken(tok, special=False, normalized=False)
        for tok, kind in zip(tokens, token_types) if kind == _USER_DEFINED
    ])

    bos_id = gguf_value(reader, "tokenizer.ggml.bos_token_id", None)
    eos_id = gguf_value(reader, "tokenizer.ggml.eos_token_id", None)
    if gguf_value(reader, "tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[bos_id]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return Tokenizer(
        backend,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        chat_template=gguf_value(reader, "tokenizer.chat_template", None),
        vocab_size=len(tokens),
    )
