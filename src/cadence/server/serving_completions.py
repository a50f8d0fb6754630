"""POST /v1/completions: whole responses and SSE streams in OpenAI's legacy completions format."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from cadence.engine.async_client import EngineDeadError, RequestStream
from cadence.server import response_format as fmt
from cadence.server.generation import (
    AbortOnCloseStreamingResponse,
    collect,
    created_timestamp,
    new_request_id,
    engine_dead_body,
    stream_error_body,
    submit,
)
from cadence.server.protocol import CompletionRequest
from cadence.server.request_mapping import (
    check_model,
    completion_prompt,
    reject_unsupported,
    sampling_fields,
)
from cadence.server.sse import DONE_EVENT, SSE_HEADERS, SSE_MEDIA_TYPE, sse_event


async def create_completion(body: CompletionRequest, request: Request) -> Any:
    arrival = time.monotonic()
    server = request.app.state.server
    check_model(body.model, server.model_name)
    reject_unsupported(body.unsupported_features())
    prompt = completion_prompt(body)
    sampling = sampling_fields(body, body.max_tokens, body.logprobs, server.max_model_len)
    req_id = new_request_id("cmpl")
    stream = await submit(server.client, req_id, prompt, sampling, body.priority, arrival)
    created = created_timestamp()
    model = server.model_name
    if body.stream:
        return AbortOnCloseStreamingResponse(
            _stream_chunks(stream, req_id, created, model, body.include_usage(),
                           body.logprobs is not None),
            on_close=stream.close, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    result = await collect(request, stream)
    logprobs = (fmt.completion_logprobs(result.logprobs, 0)
                if body.logprobs is not None else None)
    return JSONResponse(fmt.completion_response(
        req_id, created, model, result.text, result.finish_reason,
        fmt.usage_dict(result.num_prompt_tokens, result.num_output_tokens,
                       result.num_cached_tokens), logprobs))


async def _stream_chunks(stream: RequestStream, req_id: str, created: int, model: str,
                         include_usage: bool, want_logprobs: bool) -> AsyncIterator[str]:
    num_prompt = stream.num_prompt_tokens
    num_output = num_cached = 0
    text_offset = 0
    try:
        async for out in stream:
            num_prompt, num_output = out.num_prompt_tokens, out.num_output_tokens
            num_cached = out.num_cached_tokens
            if out.finish_reason == "error":
                yield sse_event(stream_error_body(out))
                break
            logprobs = None
            if want_logprobs and out.logprobs:
                logprobs = fmt.completion_logprobs(list(out.logprobs), text_offset)
            text_offset += len(out.new_text)
            # Outputs that carry no text (a held-back stop-string prefix) send nothing until
            # the last one, which carries the finish_reason.
            if out.new_text or logprobs or out.finished:
                yield sse_event(fmt.completion_chunk(
                    req_id, created, model, out.new_text,
                    out.finish_reason if out.finished else None, logprobs,
                    usage_field=include_usage))
        if include_usage:
            yield sse_event(fmt.usage_chunk(req_id, created, model, "text_completion",
                                            fmt.usage_dict(num_prompt, num_output, num_cached)))
        yield DONE_EVENT
    except EngineDeadError as exc:
        # The engine died mid-stream: say so in the stream instead of cutting it.
        yield sse_event(engine_dead_body(exc))
        yield DONE_EVENT
    finally:
        stream.close()
