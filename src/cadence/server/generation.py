"""Driving one request through the engine client: admission, streaming, collecting.

The OpenAI-format handlers (completions, chat) differ only in how they render text; admission
errors, disconnects and finish reasons are handled here once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
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
                 add_generation_prompt: bool = True,
                 kv_transfer_params: dict[str, Any] | None = None) -> RequestStream:
    """Admit the request or raise the APIError the client should see."""
    try:
        return await client.submit(
            req_id, sampling=sampling, prompt_text=prompt.text,
            prompt_token_ids=prompt.token_ids, chat_messages=prompt.chat_messages,
            add_generation_prompt=add_generation_prompt, priority=priority,
            arrival_time=arrival_time,
            **({"kv_transfer_params": kv_transfer_params} if kv_transfer_params else {}))
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


async def _collect_outputs(stream: RequestStream, result: CollectedGeneration) -> None:
    parts = []
    async for out in stream:
        parts.append(out.new_text)
        if out.logprobs:
            result.logprobs.extend(out.logprobs)
        result.num_prompt_tokens = out.num_prompt_tokens
        result.num_output_tokens = out.num_output_tokens
        result.num_cached_tokens = out.num_cached_tokens
        if out.finished:
            result.finish_reason = out.finish_reason
            result.error = out.error
            result.kv_transfer_params = out.kv_transfer_params
    result.text = "".join(parts)


async def collect(request: Request, stream: RequestStream) -> CollectedGeneration:
    """Run a non-streaming request to the end; abort it if the client goes away meanwhile."""
    result = CollectedGeneration(num_prompt_tokens=stream.num_prompt_tokens)
    task = asyncio.create_task(_collect_outputs(stream, result))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected", code="client_disconnected")
        task.result()
    except EngineDeadError as exc:
        raise APIError(503, f"The engine stopped: {exc}", code="engine_unavailable") from exc
    finally:
        if not task.done():
            task.cancel()
        stream.close()
    if result.finish_reason == "error":
        raise APIError(500, f"generation failed: {result.error or 'engine error'}",
                       code="engine_error")
    if result.finish_reason == "abort":
        raise APIError(503, "the request was aborted (server shutting down).",
                       code="request_aborted")
    return result


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
