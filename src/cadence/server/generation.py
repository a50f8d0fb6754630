"""Driving one request through the engine client: admission, streaming, collecting.

The OpenAI-format handlers (completions, chat) differ only in how they render text; admission
errors, disconnects and finish reasons are handled here once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cadence.engine.async_client import (
    AsyncEngineClient,
    EngineDeadError,
    EngineRejected,
    RequestStream,
)
from cadence.engine.outputs import RequestOutput
from cadence.engine.wire import TokenLogprob
from cadence.server.errors import APIError, error_body
from cadence.server.request_mapping import EnginePrompt

# How often a non-streaming request checks whether its client is still connected.
DISCONNECT_POLL_S = 0.25


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def submit(client: AsyncEngineClient, req_id: str, prompt: EnginePrompt,
                 sampling: dict[str, Any], priority: int, arrival_time: float,
                 **options: Any) -> RequestStream:
    """Admit the request or raise the APIError the client should see. `options`: the
    client's submit options (add_generation_prompt, want_prompt_text, chat_template, ...)."""
    try:
        return await client.submit(
            req_id, sampling=sampling, prompt_text=prompt.text,
            prompt_token_ids=prompt.token_ids, chat_messages=prompt.chat_messages,
            priority=priority, arrival_time=arrival_time, **options)
    except EngineRejected as exc:
        raise APIError(exc.status, exc.message, param=exc.param, code=exc.code) from exc
    except EngineDeadError as exc:
        raise APIError(503, f"The engine is unavailable: {exc}", code="engine_unavailable") from exc


def engine_dead_body(exc: EngineDeadError) -> dict[str, Any]:
    return error_body(503, f"the engine stopped: {exc}", code="engine_unavailable")


def stream_error_body(out: RequestOutput) -> dict[str, Any]:
    return error_body(500, f"generation failed: {out.error or 'engine error'}",
                      code="engine_error")


@dataclass
class CollectedGeneration:
    text: str = ""
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    stop_reason: str | int | None = None
    # Every generated token id (vLLM's return_token_ids).
    token_ids: list[int] = field(default_factory=list)
    # The text as it came, (text, number of tokens) per engine output: a reasoning parser
    # counts reasoning tokens by delta, as when the reply streams.
    pieces: list[tuple[str, int]] = field(default_factory=list)


class AbortOnCloseStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its engine stream when the response ends.

    On a client disconnect Starlette cancels the send loop; the generator may be left suspended
    at a `yield` until garbage collection. Closing the stream here aborts the request in the
    engine right away, whatever ended the response.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def created_timestamp() -> int:
    return int(time.time())
