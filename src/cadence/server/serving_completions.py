"""POST /v1/completions: whole responses and SSE streams in OpenAI's legacy completions format."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol import CompletionRequest
from cadence.server.request_mapping import completion_prompt
from cadence.server.serving import ResponseContext, serve_generation


class CompletionRenderer:
    """Legacy completion chunks: text deltas, the finish_reason on the last one."""

    chunk_object = "text_completion"

    def __init__(self, ctx: ResponseContext) -> None:
        self.ctx = ctx
        # Characters streamed so far: logprobs' text_offset counts from the completion start.
        self._text_offset = 0

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def output_chunks(self, out: RequestOutput) -> list[dict[str, Any]]:
        ctx = self.ctx
        logprobs = None
        if ctx.want_logprobs and out.logprobs:
            logprobs = fmt.completion_logprobs(list(out.logprobs), self._text_offset)
        self._text_offset += len(out.new_text)
        # Outputs that carry no text (a held-back stop-string prefix) send nothing until the
        # last one, which carries the finish_reason.
        if not (out.new_text or logprobs or out.finished):
            return []
        return [fmt.completion_chunk(ctx.req_id, ctx.created, ctx.model, out.new_text,
                                     out.finish_reason if out.finished else None, logprobs,
                                     usage_field=ctx.include_usage)]

    def whole_response(self, result: CollectedGeneration,
                       usage: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        logprobs = fmt.completion_logprobs(result.logprobs, 0) if ctx.want_logprobs else None
        return fmt.completion_response(ctx.req_id, ctx.created, ctx.model, result.text,
                                       result.finish_reason, usage, logprobs)


async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await serve_generation(
        request, body, id_prefix="cmpl", build_prompt=completion_prompt,
        max_tokens=body.max_tokens, logprobs=body.logprobs, renderer=CompletionRenderer)
