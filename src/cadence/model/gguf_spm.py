"""A `tokenizers` BPE equivalent to llama.cpp's SentencePiece-style ("llama") GGUF vocabulary.

The file holds tokens, a score and a type per token, no merges. llama.cpp (llm_tokenizer_spm)
tokenizes each piece of text between special / user-defined tokens by:
1. spaces -> "▁" (and a leading "▁" when `add_space_prefix`: at the start of the text and after
   every special token);
2. one symbol per character, then repeatedly merging the adjacent pair whose concatenation is a
   token with the highest score (ties: leftmost);
3. a symbol that is not a token is emitted as its UTF-8 bytes' <0xNN> tokens.
A BPE whose merges are every (left, right) split of every normal token into two tokens, ranked
by the merged token's score, makes the same choices: BPE applies the lowest-ranked adjacent
pair first, i.e. the highest-scoring merged token, and falls back to <0xNN> bytes for what is
not in the vocabulary (byte_fallback). Special (control) tokens and user-defined ones are
matched in the raw text first, as llama.cpp partitions it.
"""

from __future__ import annotations

from typing import Sequence

from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as BackendTokenizer

# llama_token_type values in tokenizer.ggml.token_type.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # "▁"


def spm_merges(tokens: Sequence[str], scores: Sequence[float],
               token_types: Sequence[int]) -> list[tuple[str, str]]:
    """Every (left, right) pair of tokens that concatenates to a normal token, best merged
    score first (ties by id, which is the order SentencePiece writes pieces of equal score)."""
    vocab = set(tokens)
    # Pieces in rank order first, so the merges come out ranked without sorting ~2 per piece.
    order = sorted((i for i, kind in enumerate(token_types) if kind == NORMAL and len(tokens[i]) > 1),
                   key=lambda i: (-scores[i], i))
    merges: list[tuple[str, str]] = []
    append = merges.append
    for token_id in order:
        token = tokens[token_id]
        for cut in range(1, len(token)):
            left = token[:cut]
            if left in vocab:
                right = token[cut:]
                if right in vocab:
                    append((left, right))
    return merges


def spm_backend(tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int],
                add_space_prefix: bool, unk_id: int | None) -> BackendTokenizer:
    """The backend tokenizer of a "llama" GGUF vocabulary (see the module docstring)."""
    vocab = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a duplicated piece: llama.cpp's map keeps the first
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, token_types),
                       unk_token=unk, byte_fallback=True, fuse_unk=False)
    backend = BackendTokenizer(model)
    # A normalizer, not a pre-tokenizer: it runs on each piece of text between added tokens,
    # and always prepends (Metaspace skips a piece that already starts with a space).
    steps = [normalizers.Prepend(SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    backend.add_special_tokens([
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types) if kind in (CONTROL, UNKNOWN)])
    backend.add_tokens([
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, token_types) if kind == USER_DEFINED])
    return backend
