"""The tokenizer `LLM.get_tokenizer()` hands out: cadence's Tokenizer with the calls code written
for a Hugging Face (transformers) tokenizer makes, with transformers' defaults.

vLLM's `get_tokenizer()` returns a transformers tokenizer, so scripts call it (`tok(text)
["input_ids"]`), `convert_ids_to_tokens`, `all_special_ids`, `pad_token_id`, and
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`. The defaults below
are transformers' (apply_chat_template tokenizes and adds no generation prompt unless asked;
decode keeps special tokens), not cadence's internal ones. Everything else falls through to the
wrapped Tokenizer (encode, eos_token_id, vocab_size, chat_template, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cadence.engine.chat_render import render_chat, text_messages

# Names checkpoints give their padding token, most specific first.
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>", "<|endoftext|>")


class BatchEncoding(dict):
    """transformers' BatchEncoding, as far as scripts use it: a dict also read by attribute."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class HFTokenizer:
    """transformers-shaped view of a cadence Tokenizer (it holds no state of its own)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._backend = tokenizer.backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    # ---- encoding ---------------------------------------------------------------------
    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True,
                 **_: Any) -> BatchEncoding:
        """{"input_ids", "attention_mask"} of one text, or lists of them for a list of texts.
        Padding/truncation/tensor options are not implemented; lists come back unpadded."""
        if isinstance(text, str):
            ids = self._tok.encode(text, add_special_tokens=add_special_tokens)
            return BatchEncoding(input_ids=ids, attention_mask=[1] * len(ids))
        ids_list = [self._tok.encode(t, add_special_tokens=add_special_tokens) for t in text]
        return BatchEncoding(input_ids=ids_list,
                             attention_mask=[[1] * len(ids) for ids in ids_list])

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).tokens

    def convert_ids_to_tokens(self, ids: int | Sequence[int],
                              skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._backend.id_to_token(self._tok.check_id(ids))
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(self._tok.check_id(i)) for i in ids if i not in special]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    # ---- decoding ---------------------------------------------------------------------
    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False,
               **_: Any) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False,
                     **_: Any) -> list[str]:
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    # ---- special tokens ---------------------------------------------------------------
    @property
    def all_special_ids(self) -> list[int]:
        ids = [i for i, tok in sorted(self._backend.get_added_tokens_decoder().items())
               if tok.special]
        for extra in (self._tok.bos_token_id, self._tok.eos_token_id):
            if extra is not None and extra not in ids:
                ids.append(extra)
        return ids

    @property
    def all_special_tokens(self) -> list[str]:
        return [self._backend.id_to_token(i) for i in self.all_special_ids]

    @property
    def pad_token_id(self) -> int | None:
        special = {tok.content: i for i, tok in self._backend.get_added_tokens_decoder().items()}
        return next((special[n] for n in _PAD_NAMES if n in special), None)

    @property
    def pad_token(self) -> str | None:
        pad = self.pad_token_id
        return None if pad is None else self._backend.id_to_token(pad)

    # ---- chat -------------------------------------------------------------------------
    def apply_chat_template(self, conversation: list[dict[str, Any]], tools: Any = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            continue_final_message: bool = False,
                            chat_template: str | None = None, return_dict: bool = False,
                            **kwargs: Any) -> str | list[int] | BatchEncoding:
        """transformers' signature: token ids unless tokenize=False; extra keyword arguments
        are template variables (as transformers passes them)."""
        for name in ("padding", "truncation", "max_length", "return_tensors"):
            kwargs.pop(name, None)
        if tools is not None:
            kwargs["tools"] = tools
        text = render_chat(self._tok, text_messages(conversation), chat_template,
                           add_generation_prompt, continue_final_message, template_kwargs=kwargs)
        if not tokenize:
            return text
        ids = self._tok.encode(text, add_special_tokens=False)  # the template spells out BOS
        if return_dict:
            return BatchEncoding(input_ids=ids, attention_mask=[1] * len(ids))
        return ids
