"""vLLM's `tokenization_kwargs` of `LLM.generate` / `LLM.chat`: how each prompt is cut after
tokenizing, as the server's `truncate_prompt_tokens` / `truncation_side` fields cut it.

vLLM moved truncation there from `SamplingParams.truncate_prompt_tokens` (deprecated in 0.14,
still taken here: the keyword wins when both are given). vLLM warns about keys it does not
know and drops them; here an unknown key is a ValueError, since a dropped key could be one
that was meant to change the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_KEYS = ("truncate_prompt_tokens", "truncation_side")


@dataclass(frozen=True)
class PromptTruncation:
    # Tokens to keep (-1: as many as the context leaves beside max_tokens); None: the
    # SamplingParams' own truncate_prompt_tokens.
    truncate_prompt_tokens: int | None = None
    # "left" keeps the prompt's last tokens (vLLM's default for generation), "right" its first.
    truncation_side: str = "left"


def prompt_truncation(tokenization_kwargs: Mapping[str, Any] | None) -> PromptTruncation:
    """The truncation that `tokenization_kwargs` asks for; ValueError naming a bad key."""
    kwargs = dict(tokenization_kwargs or {})
    unknown = sorted(set(kwargs) - set(SUPPORTED_KEYS))
    if unknown:
        raise ValueError(f"tokenization_kwargs {unknown} are not supported (supported: "
                         f"{', '.join(SUPPORTED_KEYS)})")
    k = kwargs.get("truncate_prompt_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
        raise ValueError(f"tokenization_kwargs truncate_prompt_tokens must be an int, got {k!r}")
    side = kwargs.get("truncation_side") or "left"
    if side not in ("left", "right"):
        raise ValueError(f"tokenization_kwargs truncation_side must be 'left' or 'right', "
                         f"got {side!r}")
    return PromptTruncation(k, side)
