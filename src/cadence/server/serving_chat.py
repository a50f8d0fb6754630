"""POST /v1/chat/completions: the chat template, whole responses and SSE chunk streams."""

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
from cadence.server.protocol import ChatCompletionRequest
from cadence.server.request_mapping import (
    chat_logprobs_count,
    chat_prompt,
    check_model,
    reject_unsupported,
    sampling_fields,
)
from cadence.server.sse import DONE_EVENT, SSE_HEADERS, SSE_MEDIA_TYPE, sse_event


async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    arrival = time.monotonic()
    server = request.app.state.server
    check_model(body.model, server.model_name)
    reject_unsupported(body.unsupported_features())
    prompt = chat_prompt(body)
    logprobs = chat_logprobs_count(body)
    sampling = sampling_fields(body, body.effective_max_tokens(), logprobs, server.max_model_len)
    req_id = new_request_id("chatcmpl")
    stream = await submit(server.client, req_id, prompt, sampling, body.priority, arrival,
                          add_generation_prompt=body.add_generation_prompt)
    created = created_timestamp()
    model = server.model_name
    if body.stream:
        return AbortOnCloseStreamingResponse(
            _stream_chunks(stream, req_id, created, model, body.include_usage(),
                           logprobs is not None),
            on_close=stream.close, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    result = await collect(request, stream)
    return JSONResponse(fmt.chat_response(
        req_id, created, model, result.text, result.finish_reason,
        fmt.usage_dict(result.num_prompt_tokens, result.num_output_tokens,
                       result.num_cached_tokens),
        fmt.chat_logprobs(result.logprobs) if logprobs is not None else None))


async def _stream_chunks(stream: RequestStream, req_id: str, created: int, model: str,
                         include_usage: bool, want_logprobs: bool) -> AsyncIterator[str]:
    num_prompt = stream.num_prompt_tokens
    num_output = num_cached = 0
    try:
        # OpenAI opens every chat stream with the role.
        yield sse_event(fmt.chat_chunk(req_id, created, model,
                                       {"role": "assistant", "content": ""}, None,
                                       usage_field=include_usage))
        async for out in stream:
            num_prompt, num_output = out.num_prompt_tokens, out.num_output_tokens
            num_cached = out.num_cached_tokens
            if out.finish_reason == "error":
                yield sse_event(stream_error_body(out))
                break
            logprobs = None
            if want_logprobs and out.logprobs:
                logprobs = fmt.chat_logprobs(list(out.logprobs))
            if out.new_text or logprobs:
                yield sse_event(fmt.chat_chunk(req_id, created, model,
                                               {"content": out.new_text}, None, logprobs,
                                               usage_field=include_usage))
            if out.finished:
                yield sse_event(fmt.chat_chunk(req_id, created, model, {}, out.finish_reason,
                                               usage_field=include_usage))
        if include_usage:
            yield sse_event(fmt.usage_chunk(req_id, created, model, "chat.completion.chunk",
                                            fmt.usage_dict(num_prompt, num_output, num_cached)))
        yield DONE_EVENT
    except EngineDeadError as exc:
        # The engine died mid-stream: say so in the stream instead of cutting it.
        yield sse_event(engine_dead_body(exc))
        yield DONE_EVENT
    finally:
        stream.close()
