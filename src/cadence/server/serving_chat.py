"""POST /v1/chat/completions: the chat template, whole responses and SSE chunk streams."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol import ChatCompletionRequest
from cadence.server.request_mapping import chat_logprobs_count, chat_prompt
from cadence.server.serving import ResponseContext, serve_generation


class ChatRenderer:
    """Chat completion chunks: the role first, then content deltas, then the finish_reason."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, ctx: ResponseContext) -> None:
        self.ctx = ctx

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        ctx = self.ctx
        return fmt.chat_chunk(ctx.req_id, ctx.created, ctx.model, delta, finish_reason, logprobs,
                              usage_field=ctx.include_usage)

    def opening_chunks(self) -> list[dict[str, Any]]:
        # OpenAI opens every chat stream with the role.
        return [self._chunk({"role": "assistant", "content": ""})]

    def output_chunks(self, out: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        logprobs = None
        if self.ctx.want_logprobs and out.logprobs:
            logprobs = fmt.chat_logprobs(list(out.logprobs))
        if out.new_text or logprobs:
            chunks.append(self._chunk({"content": out.new_text}, logprobs=logprobs))
        if out.finished:
            chunks.append(self._chunk({}, out.finish_reason))
        return chunks

    def whole_response(self, result: CollectedGeneration,
                       usage: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        logprobs = fmt.chat_logprobs(result.logprobs) if ctx.want_logprobs else None
        return fmt.chat_response(ctx.req_id, ctx.created, ctx.model, result.text,
                                 result.finish_reason, usage, logprobs)


async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await serve_generation(
        request, body, id_prefix="chatcmpl", build_prompt=chat_prompt,
        max_tokens=body.effective_max_tokens(), logprobs=chat_logprobs_count(body),
        renderer=ChatRenderer, add_generation_prompt=body.add_generation_prompt)
