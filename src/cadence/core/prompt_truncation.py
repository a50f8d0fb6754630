"""vLLM's truncate_prompt_tokens: keep only the last k prompt tokens before scheduling.

Left truncation (vLLM's default side for generation): the end of the prompt is what the reply
continues, so the beginning is what goes; vLLM's truncation_side "right" keeps the first k. k == -1 keeps the most the context leaves the prompt
(max_model_len - max_tokens); a k above that is refused, as vLLM refuses it, whatever the
prompt's length. Used by the engine process's admission and by the offline LLMEngine, so both
truncate the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

# /v1/completions' max_tokens when a request leaves it out (OpenAI's and vLLM's 16): the
# front end's default and what the router assumes when it counts a truncated prompt.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def prompt_room(max_model_len: int, max_tokens: int | None) -> int:
    """The most prompt tokens the context leaves beside `max_tokens` outputs (None: at least
    one output token, cadence's rule for a prompt)."""
    return max_model_len - max(max_tokens or 0, 1)


def tokens_to_keep(truncate_prompt_tokens: int, max_model_len: int,
                   max_tokens: int | None) -> int:
    """The k of truncate_prompt_tokens resolved against the context; ValueError when it is
    out of range (the message names the field, the front end answers a 400 with it)."""
    room = prompt_room(max_model_len, max_tokens)
    if truncate_prompt_tokens == -1:
        return room
    if truncate_prompt_tokens < 1:
        raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got {truncate_prompt_tokens}")
    if truncate_prompt_tokens > room:
        raise ValueError(
            f"truncate_prompt_tokens={truncate_prompt_tokens} cannot be greater than "
            f"max_model_len - max_tokens = {room}; ask for a smaller truncation size")
    return truncate_prompt_tokens


def truncate_prompt(token_ids: Sequence[int], truncate_prompt_tokens: int | None,
                    max_model_len: int, max_tokens: int | None, side: str = "left") -> list[int]:
    """The prompt's last k token ids, or its first k with side "right" (all of them when
    truncate_prompt_tokens is None)."""
    if truncate_prompt_tokens is None:
        return list(token_ids)
    if side not in ("left", "right"):
        raise ValueError(f"truncation_side must be 'left' or 'right', got {side!r}")
    keep = tokens_to_keep(truncate_prompt_tokens, max_model_len, max_tokens)
    return list(token_ids[-keep:] if side == "left" else token_ids[:keep])
