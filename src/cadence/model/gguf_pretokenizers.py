"""Byte-level BPE pre-tokenizers by llama.cpp's `tokenizer.ggml.pre` name.

A GGUF "gpt2" tokenizer names the regex split its vocabulary was trained with; llama.cpp keeps
one list of regexes per name (llama-vocab.cpp, llm_tokenizer_bpe), applied one after the other,
each splitting every piece further into matches and the text between them. We build the same
chain as `tokenizers` Split(..., "isolated") steps (with the regexes as the models'
tokenizer.json spell them: llama.cpp rewrites a few for its own regex engine) and the GPT-2
byte-to-unicode mapping after them. Some names also change llama.cpp's BPE defaults: the
Llama 3 and Tekken vocabularies take a whole pre-token that is in the vocabulary as is
(ignore_merges) and add BOS unless the file says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

_CONTRACTIONS_I = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3 = (_CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS_I + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS_I}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS_I}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT chain (not the GPT-2 regex alone).
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token


_LLAMA3_SPEC = PreTokenizerSpec((LLAMA3,), ignore_merges=True, add_bos=True)
_GPT2_SPEC = PreTokenizerSpec((GPT2,))
_SPECS: dict[str, PreTokenizerSpec] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), _LLAMA3_SPEC),
    # Same regex as Llama 3, without its defaults (Phi-4's "dbrx").
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizerSpec((LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), PreTokenizerSpec((QWEN2,))),
    "qwen35": PreTokenizerSpec((QWEN35,)),
    # SmolLM / SmolLM2: every digit on its own, then the GPT-2 regex.
    **dict.fromkeys(("smollm", "refact", "codeshell", "exaone"), PreTokenizerSpec((r"\p{N}", GPT2))),
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais"), _GPT2_SPEC),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4"), PreTokenizerSpec((GPT4O,))),
    "default": PreTokenizerSpec(DEFAULT),
}
SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_SPECS))


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec | None:
    """The spec of llama.cpp's pre-tokenizer `pre` (a missing name is llama.cpp's "default"),
    or None when cadence does not know it."""
    return _SPECS.get("default" if not pre else pre)


def build_pre_tokenizer(spec: PreTokenizerSpec) -> pre_tokenizers.PreTokenizer:
    steps = [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in spec.regexes]
    return pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
