"""Tokenizer: text <-> token ids (Hugging Face `tokenizers` backend) plus the model's chat template.

Built either from an HF folder (tokenizer.json + tokenizer_config.json) here, or from GGUF
metadata in `gguf_tokenizer.py`. Both end in the same class so the server never cares which.
"""

from __future__ import annotations

import json
import operator
import os
from typing import Any, Sequence

from tokenizers import Tokenizer as BackendTokenizer

from cadence.model.chat_template import ChatTemplate

# Special tokens that end an assistant turn in common chat formats; they stop generation in
# addition to the model's EOS when the vocabulary has them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                      "<|endoftext|>", "</s>", "<|end_of_text|>")


# Texts longer than this are encoded without holding the GIL (see Tokenizer.encode).
GIL_FREE_ENCODE_CHARS = 4096


class TokenizerError(ValueError):
    """A tokenizer could not be built, or was asked to encode/decode something invalid."""


class Tokenizer:
    """Encode, decode and chat-format text for one model."""

    def __init__(self, backend: BackendTokenizer, *, eos_token_id: int | None,
                 bos_token_id: int | None = None, chat_template: str | None = None,
                 vocab_size: int | None = None, end_of_turn_ids: Sequence[int] = ()):
        self.backend = backend
        self.vocab_size = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.bos_token = self._token_text(bos_token_id)
        self.eos_token = self._token_text(eos_token_id)
        self._chat_template = (
            ChatTemplate(chat_template, self.bos_token, self.eos_token) if chat_template else None
        )
        # EOS, the ids the checkpoint names as ends of turns (GGUF eot/eom), then known names.
        stop = [] if eos_token_id is None else [eos_token_id]
        stop += [t for t in dict.fromkeys(end_of_turn_ids) if t not in stop]
        special = {tok.content for tok in backend.get_added_tokens_decoder().values() if tok.special}
        for name in END_OF_TURN_TOKENS:
            token_id = backend.token_to_id(name)
            if name in special and token_id is not None and token_id not in stop:
                stop.append(token_id)
        self.stop_token_ids: tuple[int, ...] = tuple(stop)
        self._max_token_chars: int | None = None

    def _token_text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    def with_chat_template(self, source: str) -> "Tokenizer":
        """A copy of this tokenizer that formats chats with `source` (--chat-template)."""
        import copy

        other = copy.copy(self)
        other._chat_template = ChatTemplate(source, self.bos_token, self.eos_token)
        return other

    @property
    def chat_template(self) -> str | None:
        """The template source, or None when the model ships none."""
        return None if self._chat_template is None else self._chat_template.source

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token text like '<|im_start|>' maps to its single id."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        if len(text) > GIL_FREE_ENCODE_CHARS:
            # Same ids; `encode_batch` releases the GIL while it works (`encode` holds it), so
            # a long prompt tokenized in a worker thread does not stall the engine's steps.
            return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def max_token_chars(self) -> int:
        """The most characters any one token decodes to (special tokens included): a text of
        n characters has at least n / max_token_chars() tokens."""
        if self._max_token_chars is None:
            self._max_token_chars = max(
                (len(self.backend.decode([i], skip_special_tokens=False))
                 for i in range(self.backend.get_vocab_size(with_added_tokens=True))), default=1)
        return max(1, self._max_token_chars)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 byte sequences become U+FFFD (as HF decodes them)."""
        ids = [self.check_id(token_id) for token_id in ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_checked(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """decode() of ids the caller already passed through check_id (the streaming
        detokenizer, once per token per request)."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def check_id(self, token_id: Any) -> int:
        """token_id as a plain int; TokenizerError unless it is an integer in [0, vocab_size)."""
        try:
            value = operator.index(token_id)  # ints and numpy ints; not floats or strings
        except TypeError:
            value = None
        if value is None or not 0 <= value < self.vocab_size:
            raise TokenizerError(f"token id {token_id!r} outside [0, {self.vocab_size})")
        return value

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """Prompt text for an OpenAI-style conversation (encode it with add_special_tokens=False)."""
        if self._chat_template is None:
            raise TokenizerError("this model has no chat template; use a plain completion prompt")
        return self._chat_template.render(messages, add_generation_prompt, **kwargs)

    @classmethod
    def from_hf_dir(cls, path: str, vocab_size: int | None = None) -> "Tokenizer":
        """Load tokenizer.json, tokenizer_config.json (and chat_template.jinja) from an HF folder.

        `vocab_size` is the model's, when its embedding is padded past the tokenizer's ids: those
        ids are then valid and decode to nothing (as in transformers).
        """
        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tok_file):
            raise TokenizerError(f"no tokenizer.json in {path}")
        try:
            backend = BackendTokenizer.from_file(tok_file)
        except Exception as exc:  # the Rust library raises a bare Exception on bad JSON
            raise TokenizerError(f"cannot read {tok_file}: {exc}") from exc
        cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # multiple named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()
        if template is None:  # processor-style repos (Gemma 3): {"chat_template": "..."}
            template = _read_json(os.path.join(path, "chat_template.json")).get("chat_template")
        bos_id = _special_id(backend, cfg.get("bos_token"))
        eos_id = _special_id(backend, cfg.get("eos_token"))
        if eos_id is None:
            model_cfg = _read_json(os.path.join(path, "config.json"))
            eos = model_cfg.get("eos_token_id")
            eos_id = eos[0] if isinstance(eos, list) and eos else eos
        size = max(vocab_size or 0, backend.get_vocab_size(with_added_tokens=True))
        return cls(backend, eos_token_id=eos_id, bos_token_id=bos_id, chat_template=template,
                   vocab_size=size)


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc


def _special_id(backend: BackendTokenizer, token: Any) -> int | None:
    # tokenizer_config.json spells special tokens as a string or as {"content": ...}.
    if isinstance(token, dict):
        token = token.get("content")
    return backend.token_to_id(token) if isinstance(token, str) else None
