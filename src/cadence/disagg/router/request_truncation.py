"""How many prompt tokens a worker keeps of a request with vLLM's truncate_prompt_tokens, as
the router sees the body: the routing (prefix hashes, prompt size, KV room) must count the
prompt the worker runs, not the one the client sent.

k >= 1 keeps k; -1 keeps what the context leaves beside the request's output, which needs the
workers' max_model_len (from their /tokenize replies) and the output count as the worker
reads it (core/prompt_truncation.py: completions' max_tokens defaults to 16, chat's to none,
which leaves room for one token). Values the worker refuses resolve to None here: the
worker's 400 then reaches the client unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cadence.core.prompt_truncation import COMPLETIONS_DEFAULT_MAX_TOKENS, tokens_to_keep


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def output_tokens(kind: str, body: dict[str, Any]) -> int | None:
    """The request's max_tokens as a worker reads it for truncation (None: unset)."""
    if kind == "chat":
        given = body.get("max_completion_tokens")
        return _int(given if given is not None else body.get("max_tokens"))
    return _int(body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS))


def kept_prompt_tokens(kind: str, body: dict[str, Any], max_model_len: int | None) -> int | None:
    """The number of prompt tokens the worker keeps (None: no truncation asked, or not known
    here: -1 before any worker told its context length, or a value the worker refuses)."""
    keep = _int(body.get("truncate_prompt_tokens"))
    if keep is None or (keep == -1 and not max_model_len):
        return None
    if keep >= 1 and not max_model_len:
        return keep
    try:
        return tokens_to_keep(keep, max_model_len, output_tokens(kind, body))
    except ValueError:
        return None


def truncated(token_ids: Sequence[int], body: dict[str, Any], keep: int | None) -> Sequence[int]:
    """The ids the worker runs: the last `keep` (the first with truncation_side "right")."""
    if keep is None or len(token_ids) <= keep:
        return token_ids
    return token_ids[:keep] if body.get("truncation_side") == "right" else token_ids[-keep:]
