"""POST /v1/chat/completions: the chat template, whole responses and SSE chunk streams."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol import ChatCompletionRequest
from cadence.server.request_mapping import chat_logprobs_count, chat_prompt
from cadence.server.errors import APIError
from cadence.server.serving import ResponseContext, serve_generation
from cadence.server.tool_parsers import TOOL_PARSERS, ToolCall

# A tool-call parser: the reply's text -> (content, calls).
ToolParser = Callable[[str], tuple[str | None, list[ToolCall]]]


class ChatRenderer:
    """Chat completion chunks per choice: the role first, then content deltas, then the
    finish_reason."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, ctx: ResponseContext, tool_parser: ToolParser | None = None) -> None:
        self.ctx = ctx
        # With tools: each choice's text is held until it ends, then read for tool calls
        # (a call cannot be told from prose before it is whole).
        self.tool_parser = tool_parser
        self._held: dict[int, list[str]] = {}

    def _chunk(self, index: int, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None,
               stop_reason: str | int | None = None) -> dict[str, Any]:
        ctx = self.ctx
        return fmt.chat_chunk(ctx.req_id, ctx.created, ctx.model, delta, finish_reason, logprobs,
                              usage_field=ctx.include_usage, index=index,
                              stop_reason=stop_reason)

    def opening_chunks(self, index: int) -> list[dict[str, Any]]:
        # OpenAI opens every chat choice with the role (echo puts the echoed text there).
        return [self._chunk(index, {"role": "assistant",
                                    "content": self.ctx.echo.get(index, "")})]

    def output_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        if self.tool_parser is not None:
            return self._tool_chunks(out, index)
        chunks = []
        logprobs = None
        if self.ctx.want_logprobs and out.logprobs:
            logprobs = fmt.chat_logprobs(list(out.logprobs))
        if out.new_text or logprobs:
            chunks.append(self._chunk(index, {"content": out.new_text}, logprobs=logprobs))
        if out.finished:
            chunks.append(self._chunk(index, {}, out.finish_reason,
                                      stop_reason=out.stop_reason))
        return chunks

    def _tool_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        self._held.setdefault(index, []).append(out.new_text)
        if not out.finished:
            return []
        content, calls = self.tool_parser("".join(self._held.pop(index)))
        chunks = []
        if content:
            chunks.append(self._chunk(index, {"content": content}))
        if calls:
            chunks.append(self._chunk(index, {"tool_calls": [
                c.to_openai(k) for k, c in enumerate(calls)]}))
        reason = "tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason
        chunks.append(self._chunk(index, {}, reason, stop_reason=out.stop_reason))
        return chunks

    def whole_response(self, results: list[CollectedGeneration],
                       usage: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        choices = [
            fmt.chat_choice(ctx.echo.get(i, "") + r.text, r.finish_reason,
                            fmt.chat_logprobs(r.logprobs) if ctx.want_logprobs else None,
                            r.stop_reason)
            for i, r in enumerate(results)
        ]
        if self.tool_parser is not None:
            for choice, r in zip(choices, results):
                content, calls = self.tool_parser(r.text)
                if calls:
                    choice["message"]["content"] = content
                    choice["message"]["tool_calls"] = [c.to_openai(k)
                                                       for k, c in enumerate(calls)]
                    if choice["finish_reason"] == "stop":
                        choice["finish_reason"] = "tool_calls"
        return fmt.chat_response(ctx.req_id, ctx.created, ctx.model, choices, usage)


def tool_setup(body: ChatCompletionRequest, request: Request) -> tuple[ToolParser | None,
                                                                         dict | None]:
    """(the parser to read replies with, chat_template_kwargs with the tools) for a request;
    APIError when it asks for tool calling this server does not do."""
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if choice not in ("auto", "none"):
        raise APIError(400, "tool_choice 'required' or a named function is not supported; "
                       "use 'auto' (or 'none').", param="tool_choice",
                       code="unsupported_parameter")
    if not body.tools:
        return None, body.chat_template_kwargs
    parser_name = request.app.state.server.config.tool_call_parser
    if parser_name is None:
        raise APIError(400, "tool calling needs the server started with "
                       "--enable-auto-tool-choice --tool-call-parser "
                       f"{{{','.join(sorted(TOOL_PARSERS))}}}.", param="tools",
                       code="unsupported_parameter")
    kwargs = {"tools": body.tools, **(body.chat_template_kwargs or {})}
    return (TOOL_PARSERS[parser_name] if choice == "auto" else None), kwargs


async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    # echo (vLLM): a final message of the assistant's role is repeated before the reply.
    last = body.messages[-1]
    echo_text = last.content if (body.echo and last.role == "assistant"
                                 and isinstance(last.content, str)) else ""
    tool_parser, template_kwargs = tool_setup(body, request)
    return await serve_generation(
        request, body, id_prefix="chatcmpl", prompts=[chat_prompt(body)],
        max_tokens=body.effective_max_tokens(), logprobs=chat_logprobs_count(body),
        renderer=functools.partial(ChatRenderer, tool_parser=tool_parser),
        submit_kwargs={"add_generation_prompt": body.add_generation_prompt,
                       "chat_template": body.chat_template,
                       "continue_final_message": body.continue_final_message,
                       "chat_template_kwargs": template_kwargs},
        echo=(lambda mux: {i: echo_text for i in range(body.n)}) if echo_text else None)
