"""Reading OpenAI-style server-sent events: one JSON object per `data:` line, `[DONE]` at the end.

Only what the benchmark needs: the text of a chunk, how many tokens it carries, its finish
reason, usage, and in-stream errors. Works for /v1/completions (choices[].text) and
/v1/chat/completions (choices[].delta.content).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


@dataclass(frozen=True)
class ChunkInfo:
    """What one data event says. `tokens` is len(logprobs.tokens) when the server lists them
    (exact), else 1 for a chunk with text and 0 for one without (e.g. the final usage chunk)."""

    tokens: int
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    error: str | None
    counted_by_logprobs: bool


class SSEFormatError(ValueError):
    """A data line that is not JSON (the stream is then treated as failed)."""


def data_payload(line: str) -> str | None:
    """The payload of a `data:` line, or None for comments, event names, ids and blank lines."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def parse_chunk(payload: str) -> ChunkInfo:
    """Interpret one data payload (not `[DONE]`)."""
    try:
        event = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise SSEFormatError(f"data line is not JSON: {payload[:200]!r}") from exc
    if not isinstance(event, dict):
        raise SSEFormatError(f"data line is not a JSON object: {payload[:200]!r}")
    if event.get("error") is not None:
        err = event["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return ChunkInfo(0, "", None, None, message, False)
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else None
    choices = event.get("choices") or []
    if not choices:
        return ChunkInfo(0, "", None, usage, None, False)
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content") or ""
    logprobs = choice.get("logprobs")
    listed = None
    if isinstance(logprobs, dict):
        # completions: logprobs.tokens; chat: logprobs.content (one entry per token)
        listed = logprobs.get("tokens", logprobs.get("content"))
    if isinstance(listed, list):
        tokens, by_logprobs = len(listed), True
    else:
        tokens, by_logprobs = (1 if text else 0), False
    return ChunkInfo(tokens, text, choice.get("finish_reason"), usage, None, by_logprobs)
