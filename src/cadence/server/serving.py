"""The flow every OpenAI generation endpoint shares: map, admit, then stream or collect.

    handler -> serve_generation(request, body, id_prefix, build_prompt, ..., renderer)
               checks (model, unsupported features), prompt, sampling fields, admission
               stream=true:  SSE events from `stream_events`, closed on any exit
               stream=false: `collect` to the end, one JSON body

Endpoints differ only in how they render outputs: a ResponseRenderer per endpoint (chat,
completions) builds the OpenAI chunks and the whole response. Errors, engine death, usage and
[DONE] are handled here once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from cadence.engine.async_client import EngineDeadError, RequestStream
from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import (
    AbortOnCloseStreamingResponse,
    CollectedGeneration,
    collect,
    created_timestamp,
    engine_dead_body,
    new_request_id,
    stream_error_body,
    submit,
)
from cadence.server.protocol import SamplingRequestFields
from cadence.server.request_mapping import (
    EnginePrompt,
    check_model,
    check_prompt_size,
    reject_unsupported,
    sampling_fields,
)
from cadence.server.sse import DONE_EVENT, SSE_HEADERS, SSE_MEDIA_TYPE, sse_event

Body = TypeVar("Body", bound=SamplingRequestFields)


@dataclass(frozen=True)
class ResponseContext:
    """What every chunk of one response repeats, and what the client asked to be shown."""

    req_id: str
    created: int
    model: str
    include_usage: bool
    want_logprobs: bool


class ResponseRenderer(Protocol):
    """One endpoint's OpenAI format for one response. A fresh renderer serves each request,
    so it may keep state across chunks (e.g. a text offset)."""

    # The "object" of this endpoint's stream chunks (the include_usage chunk repeats it).
    chunk_object: str

    def opening_chunks(self) -> list[dict[str, Any]]:
        """Chunks sent before any output."""
        ...

    def output_chunks(self, out: RequestOutput) -> list[dict[str, Any]]:
        """Chunks for one engine output (never one with finish_reason "error")."""
        ...

    def whole_response(self, result: CollectedGeneration,
                       usage: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming response body."""
        ...


async def serve_generation(
    request: Request,
    body: Body,
    *,
    id_prefix: str,
    build_prompt: Callable[[Body], EnginePrompt],
    max_tokens: int | None,
    logprobs: int | None,
    renderer: Callable[[ResponseContext], ResponseRenderer],
    add_generation_prompt: bool = True,
) -> Response:
    """Validate `body`, admit it in the engine, answer with SSE events or one JSON body.

    `logprobs` is the number of alternatives asked for (None: no logprobs at all)."""
    arrival = time.monotonic()
    server = request.app.state.server
    check_model(body.model, server.model_name)
    reject_unsupported(body.unsupported_features())
    prompt = build_prompt(body)
    check_prompt_size(prompt, server.max_model_len, server.max_token_chars)
    sampling = sampling_fields(body, max_tokens, logprobs, server.max_model_len)
    req_id = new_request_id(id_prefix)
    stream = await submit(server.client, req_id, prompt, sampling, body.priority, arrival,
                          add_generation_prompt=add_generation_prompt,
                          kv_transfer_params=body.kv_transfer_params)
    ctx = ResponseContext(req_id, created_timestamp(), server.model_name, body.include_usage(),
                          logprobs is not None)
    render = renderer(ctx)
    if body.stream:
        return AbortOnCloseStreamingResponse(
            stream_events(stream, ctx, render), on_close=stream.close,
            media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    result = await collect(request, stream)
    usage = fmt.usage_dict(result.num_prompt_tokens, result.num_output_tokens,
                           result.num_cached_tokens)
    response = render.whole_response(result, usage)
    if result.kv_transfer_params is not None:
        # A prefill worker's handoff (or a decode worker's transfer record), as vLLM answers.
        response["kv_transfer_params"] = result.kv_transfer_params
    return JSONResponse(response)


async def stream_events(stream: RequestStream, ctx: ResponseContext,
                        render: ResponseRenderer) -> AsyncIterator[str]:
    """The SSE events of one streamed response, [DONE] last; closes the stream on any exit."""
    num_prompt = stream.num_prompt_tokens
    num_output = num_cached = 0
    try:
        for chunk in render.opening_chunks():
            yield sse_event(chunk)
        async for out in stream:
            num_prompt, num_output = out.num_prompt_tokens, out.num_output_tokens
            num_cached = out.num_cached_tokens
            if out.finish_reason == "error":
                yield sse_event(stream_error_body(out))
                break
            for chunk in render.output_chunks(out):
                yield sse_event(chunk)
        if ctx.include_usage:
            yield sse_event(fmt.usage_chunk(ctx.req_id, ctx.created, ctx.model,
                                            render.chunk_object,
                                            fmt.usage_dict(num_prompt, num_output, num_cached)))
        yield DONE_EVENT
    except EngineDeadError as exc:
        # The engine died mid-stream: say so in the stream instead of cutting it.
        yield sse_event(engine_dead_body(exc))
        yield DONE_EVENT
    finally:
        stream.close()
