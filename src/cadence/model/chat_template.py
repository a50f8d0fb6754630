"""Chat templates: render a Jinja2 template (as shipped in GGUF / tokenizer_config.json) safely."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    # Templates call raise_exception("...") to reject bad conversations (e.g. roles out of order).
    raise ValueError(f"chat template rejected the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template, rendered the way Hugging Face transformers renders it.

    The environment is sandboxed (templates come with downloaded models) and uses the same
    whitespace rules as transformers (trim_blocks, lstrip_blocks), so prompts match token for token.
    """

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from exc
        self.source = source
        self._bos_token = bos_token or ""
        self._eos_token = eos_token or ""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """Render the conversation to prompt text; raises ValueError for malformed messages."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"message {i} must be a dict with a 'role' key, got {message!r}")
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed to render: {exc}") from exc
