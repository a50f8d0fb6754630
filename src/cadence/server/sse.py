"""Server-sent events framing exactly as OpenAI streams it: `data: {json}\\n\\n`, then `[DONE]`."""

from __future__ import annotations

import json
from typing import Any

DONE_EVENT = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_MEDIA_TYPE = "text/event-stream"


def sse_event(payload: dict[str, Any]) -> str:
    """One SSE event carrying a JSON object (compact, UTF-8 kept as is)."""
    return "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def sse_named_event(payload: dict[str, Any]) -> str:
    """One SSE event named by its payload's `type` (the Responses API's framing:
    `event: response.created` then its data line)."""
    return f"event: {payload['type']}\n" + sse_event(payload)
