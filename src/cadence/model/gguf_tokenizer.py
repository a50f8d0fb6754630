"""Build a Tokenizer from the tokenizer a GGUF file describes in its metadata.

Two vocabulary models, as llama.cpp reads them (`tokenizer.ggml.model`):
- "gpt2": a byte-level BPE, its vocabulary already spelled in the GPT-2 byte alphabet, its merges,
  a token type per id and the name of the pre-tokenizer regex it was trained with
  (`tokenizer.ggml.pre`, see gguf_pretokenizers);
- "llama": a SentencePiece-style vocabulary of tokens, scores and types with <0xNN> byte
  tokens (Gemma, Phi-3, Llama 2, Mistral v0.3), see gguf_spm.
Either is rebuilt as the equivalent `tokenizers` pipeline. BOS is added as
`tokenizer.ggml.add_bos_token` says, else by llama.cpp's default for the model and pre-tokenizer.
"""

from __future__ import annotations

import gguf
from tokenizers import AddedToken, decoders, models, processors
from tokenizers import Tokenizer as BackendTokenizer

from cadence.model.gguf_fields import GGUFFile, gguf_value
from cadence.model.gguf_pretokenizers import (SUPPORTED_PRE_TOKENIZERS, build_pre_tokenizer,
                                              pre_tokenizer_spec)
from cadence.model.gguf_spm import CONTROL, NORMAL, USER_DEFINED, spm_backend
from cadence.model.tokenizer import Tokenizer, TokenizerError

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")


def _bpe_backend(reader: GGUFFile | gguf.GGUFReader, tokens: list[str],
                 token_types: list[int]) -> tuple[BackendTokenizer, bool]:
    """(backend, llama.cpp's add-BOS default) of a "gpt2" vocabulary."""
    pre = gguf_value(reader, "tokenizer.ggml.pre", None)
    spec = pre_tokenizer_spec(pre)
    if spec is None:
        raise TokenizerError(f"GGUF pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)})")
    try:
        merges: list[str] = gguf_value(reader, "tokenizer.ggml.merges")
    except KeyError as exc:
        raise TokenizerError(f"GGUF tokenizer metadata incomplete: {exc}") from exc
    pairs = []
    for merge in merges:
        # llama.cpp splits at the first space after the first character.
        cut = merge.find(" ", 1)
        if cut < 0:
            raise TokenizerError(f"malformed GGUF merge {merge!r}")
        pairs.append((merge[:cut], merge[cut + 1:]))
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    try:
        model = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=spec.ignore_merges)
    except Exception as exc:  # the Rust library raises a bare Exception (a merge of unknown tokens)
        raise TokenizerError(f"GGUF BPE vocabulary is inconsistent: {exc}") from exc
    backend = BackendTokenizer(model)
    backend.pre_tokenizer = build_pre_tokenizer(spec)
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|> ...) must be matched whole in text and skipped when decoding;
    # user-defined ones are matched whole but kept in the output text.
    backend.add_special_tokens([
        AddedToken(tok, special=True, normalized=False)
        for tok, kind in zip(tokens, token_types) if kind == CONTROL
    ])
    backend.add_tokens([
        AddedToken(tok, special=False, normalized=False)
        for tok, kind in zip(tokens, token_types) if kind == USER_DEFINED
    ])
    return backend, spec.add_bos


def _spm_backend(reader: GGUFFile | gguf.GGUFReader, tokens: list[str],
                 token_types: list[int]) -> tuple[BackendTokenizer, bool]:
    """(backend, llama.cpp's add-BOS default) of a "llama" vocabulary."""
    scores = gguf_value(reader, "tokenizer.ggml.scores", None)
    if scores is None or len(scores) != len(tokens):
        raise TokenizerError("GGUF SentencePiece vocabulary needs one tokenizer.ggml.scores entry per token")
    if gguf_value(reader, "tokenizer.ggml.remove_extra_whitespaces", False):
        raise TokenizerError("GGUF tokenizer.ggml.remove_extra_whitespaces is not supported")
    backend = spm_backend(tokens, scores, token_types,
                          add_space_prefix=bool(gguf_value(reader, "tokenizer.ggml.add_space_prefix", True)),
                          unk_id=gguf_value(reader, "tokenizer.ggml.unknown_token_id", 0))
    return backend, True


def tokenizer_from_gguf(reader: GGUFFile | gguf.GGUFReader) -> Tokenizer:
    """Rebuild the model's tokenizer and chat template from GGUF metadata; TokenizerError for a
    vocabulary model or pre-tokenizer cadence does not know, naming the supported ones."""
    model_type = gguf_value(reader, "tokenizer.ggml.model", None)
    if model_type not in SUPPORTED_TOKENIZER_MODELS:
        raise TokenizerError(f"GGUF tokenizer model {model_type!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_TOKENIZER_MODELS)})")
    try:
        tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
    except KeyError as exc:
        raise TokenizerError(f"GGUF tokenizer metadata incomplete: {exc}") from exc
    token_types: list[int] = gguf_value(reader, "tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    build = _bpe_backend if model_type == "gpt2" else _spm_backend
    backend, add_bos_default = build(reader, tokens, token_types)

    bos_id = gguf_value(reader, "tokenizer.ggml.bos_token_id", None)
    eos_id = gguf_value(reader, "tokenizer.ggml.eos_token_id", None)
    add_bos = gguf_value(reader, "tokenizer.ggml.add_bos_token", add_bos_default) and bos_id is not None
    add_eos = gguf_value(reader, "tokenizer.ggml.add_eos_token", False) and eos_id is not None
    if add_bos or add_eos:
        specials = []
        single = "$A"
        if add_bos:
            single = f"{tokens[bos_id]} {single}"
            specials.append((tokens[bos_id], bos_id))
        if add_eos:
            single = f"{single} {tokens[eos_id]}"
            specials.append((tokens[eos_id], eos_id))
        pair = f"{single} {single.replace('$A', '$B')}"
        backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=list(dict(specials).items()))
    ends = [gguf_value(reader, f"tokenizer.ggml.{name}_token_id", None) for name in ("eot", "eom")]
    return Tokenizer(
        backend,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        chat_template=gguf_value(reader, "tokenizer.chat_template", None),
        vocab_size=len(tokens),
        end_of_turn_ids=[t for t in ends if t is not None and 0 <= t < len(tokens)],
    )
