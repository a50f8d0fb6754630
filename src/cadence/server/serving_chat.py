"""POST /v1/chat/completions: the chat template, whole responses and SSE chunk streams."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol import ChatCompletionRequest
from cadence.server.reasoning_parsers import ReasoningMode, reasoning_mode
from cadence.server.reasoning_stream import Piece, ReasoningSplitter, split_pieces
from cadence.server.request_mapping import chat_logprobs_count, chat_prompt, message_text
from cadence.server.serving import ResponseContext, serve_generation
from cadence.server.token_ids import PendingTokenIds, logprobs_as_token_ids
from cadence.server.tool_choice import ToolMode, tool_mode
from cadence.server.tool_streaming import START


class ChatRenderer:
    """Chat completion chunks per choice: the role first, then content deltas, then the
    finish_reason."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, ctx: ResponseContext, tools: ToolMode | None = None,
                 reasoning: ReasoningMode | None = None) -> None:
        self.ctx = ctx
        # With tools: each choice's text goes through an incremental reader (tool_streaming)
        # that sends content, and calls as they are written (name, then argument pieces).
        self.tools = tools
        # With a reasoning parser: each choice's text is split first (reasoning_stream); the
        # reasoning goes out as `reasoning` deltas, the content on to the tool reader.
        self.reasoning = reasoning
        self._splitters: dict[int, ReasoningSplitter] = {}
        self._reasoning_tokens: dict[int, int] = {}
        # include_reasoning=false: no logprobs or token ids either (they would show it).
        self._hide_tokens = reasoning is not None and not reasoning.include
        self._readers: dict[int, Any] = {}
        self._called: set[int] = set()  # choices that sent a call
        self._pending_logprobs: dict[int, list] = {}  # per choice: entries not yet sent
        self._pending_ids = PendingTokenIds()  # return_token_ids: ids not yet sent

    def _chunk(self, index: int, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None,
               stop_reason: str | int | None = None) -> dict[str, Any]:
        ctx = self.ctx
        chunk = fmt.chat_chunk(ctx.req_id, ctx.created, ctx.model, delta, finish_reason,
                               logprobs, usage_field=ctx.include_usage, index=index,
                               stop_reason=stop_reason)
        if ctx.return_token_ids and not self._hide_tokens:  # vLLM's: each chunk's new ids
            chunk["choices"][0]["token_ids"] = self._pending_ids.take(index)
        return chunk

    def _logprobs(self, entries: list) -> dict[str, Any]:
        if self.ctx.tokens_as_ids:
            entries = logprobs_as_token_ids(entries)
        return fmt.chat_logprobs(entries)

    def opening_chunks(self, index: int) -> list[dict[str, Any]]:
        # OpenAI opens every chat choice with the role (echo puts the echoed text there).
        chunk = self._chunk(index, {"role": "assistant", "content": self.ctx.echo.get(index, "")})
        if self.ctx.return_token_ids:  # vLLM's: the prompt's ids on the response, first chunk
            chunk["prompt_token_ids"] = self.ctx.prompt_token_ids.get(index, [])
        return [chunk]

    def output_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        if self.ctx.return_token_ids:
            self._pending_ids.add(index, out.new_token_ids)
        if self.tools is not None or self.reasoning is not None:
            return self._parsed_chunks(out, index)
        chunks = []
        logprobs = None
        if self.ctx.want_logprobs and out.logprobs:
            logprobs = self._logprobs(list(out.logprobs))
        if out.new_text or logprobs:
            chunks.append(self._chunk(index, {"content": out.new_text}, logprobs=logprobs))
        if out.finished:
            chunks.append(self._chunk(index, {}, out.finish_reason,
                                      stop_reason=out.stop_reason))
        return chunks

    def _split(self, out: RequestOutput, index: int) -> Piece:
        """This output's text as reasoning and content (all content without a parser)."""
        if self.reasoning is None or self.reasoning.format is None:
            return Piece("", out.new_text)
        splitter = self._splitters.get(index)
        if splitter is None:
            splitter = self._splitters[index] = ReasoningSplitter(self.reasoning.format)
        piece = splitter.feed(out.new_text, len(out.new_token_ids))
        if out.finished:
            piece = piece + splitter.finish()
            del self._splitters[index]
        self._reasoning_tokens[index] = splitter.reasoning_tokens
        return piece

    def _parsed_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        piece = self._split(out, index)
        if self.ctx.want_logprobs and out.logprobs and not self._hide_tokens:
            self._pending_logprobs.setdefault(index, []).extend(out.logprobs)
        chunks = []
        if piece.reasoning and self.reasoning.include:
            # vLLM's `reasoning`, and `reasoning_content` (its name before, DeepSeek's).
            delta = {"reasoning": piece.reasoning, "reasoning_content": piece.reasoning}
            chunks.append(self._chunk(index, delta, logprobs=self._take_logprobs(index)))
        if self.tools is None:
            if piece.content:
                chunks.append(self._chunk(index, {"content": piece.content},
                                          logprobs=self._take_logprobs(index)))
        else:
            reader = self._readers.get(index)
            if reader is None:
                reader = self._readers[index] = self.tools.new_stream()
            events = reader.feed(piece.content) if piece.content else []
            if out.finished:
                events += reader.finish()
                del self._readers[index]
            for event in events:
                if event.kind == START:
                    self._called.add(index)
                chunks.append(self._chunk(index, event.delta(),
                                          logprobs=self._take_logprobs(index)))
        if out.finished:
            reason = out.finish_reason
            if (index in self._called and reason == "stop"
                    and self.tools.finish_as_tool_calls):
                reason = "tool_calls"
            chunks.append(self._chunk(index, {}, reason, logprobs=self._take_logprobs(index),
                                      stop_reason=out.stop_reason))
        return chunks

    def _take_logprobs(self, index: int) -> dict[str, Any] | None:
        # The reader holds text back until it knows whether it is content or a call, so a
        # token's logprob rides on the next chunk this choice sends (at the latest the finish
        # chunk): every token's entry goes out once, in order, as vLLM's stream sends them.
        pending = self._pending_logprobs.pop(index, None)
        return self._logprobs(pending) if pending else None

    def completion_tokens_details(self) -> dict[str, int] | None:
        """usage.completion_tokens_details so far: vLLM reports the reasoning tokens whenever
        the server has a reasoning parser."""
        if self.reasoning is None:
            return None
        return {"reasoning_tokens": sum(self._reasoning_tokens.values())}

    def _split_whole(self, choices: list[dict[str, Any]], results: list[CollectedGeneration],
                     usage: dict[str, Any]) -> list[str | None]:
        """Put each choice's reasoning and content in its message (vLLM's fields: reasoning,
        and reasoning_content as before; null where there is none); the contents."""
        contents: list[str | None] = []
        for i, (choice, r) in enumerate(zip(choices, results)):
            reasoning, content = None, r.text
            if self.reasoning.format is not None:
                reasoning, content, self._reasoning_tokens[i] = split_pieces(
                    self.reasoning.format, r.pieces)
            if not self.reasoning.include:
                reasoning = None
            message = choice["message"]
            echo = self.ctx.echo.get(i, "")
            message["content"] = echo + content if content is not None or echo else None
            message["reasoning"] = message["reasoning_content"] = reasoning
            contents.append(content)
        usage["completion_tokens_details"] = self.completion_tokens_details()
        return contents

    def whole_response(self, results: list[CollectedGeneration],
                       usage: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        show_logprobs = ctx.want_logprobs and not self._hide_tokens
        choices = [
            fmt.chat_choice(ctx.echo.get(i, "") + r.text, r.finish_reason,
                            self._logprobs(r.logprobs) if show_logprobs else None,
                            r.stop_reason)
            for i, r in enumerate(results)
        ]
        replies = [r.text for r in results]  # what the tool reader reads: the content
        if self.reasoning is not None:
            replies = self._split_whole(choices, results, usage)
        if self.tools is not None:
            for choice, reply in zip(choices, replies):
                content, calls = self.tools.whole(reply) if reply is not None else (None, [])
                if calls:
                    choice["message"]["content"] = content
                    choice["message"]["tool_calls"] = [c.to_openai(k)
                                                       for k, c in enumerate(calls)]
                    if choice["finish_reason"] == "stop" and self.tools.finish_as_tool_calls:
                        choice["finish_reason"] = "tool_calls"
        if ctx.return_token_ids and not self._hide_tokens:
            # vLLM's: generated ids per choice, the prompt's on the response
            for choice, r in zip(choices, results):
                choice["token_ids"] = list(r.token_ids)
        response = fmt.chat_response(ctx.req_id, ctx.created, ctx.model, choices, usage)
        if ctx.return_token_ids:
            response["prompt_token_ids"] = ctx.prompt_token_ids.get(0, [])
        scores = ctx.prompt_scores_of(0)
        if scores is not None:
            response["prompt_logprobs"] = fmt.prompt_logprobs_field(scores)  # vLLM's, top level
        return response


async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    config = request.app.state.server.config
    tools = tool_mode(body.tools, body.tool_choice, config.tool_call_parser)
    # The tools reach the chat template (whatever tool_choice says, as in vLLM), with
    # documents and reasoning_effort.
    template_kwargs = body.template_variables()
    reasoning = reasoning_mode(config.reasoning_parser, template_kwargs,
                               grammar=body.structured_outputs_spec() is not None,
                               include=body.include_reasoning)
    prompt = chat_prompt(body)  # a 400 for a non-text content part, before echo reads the parts
    # echo (vLLM): a final message of the assistant's role is repeated before the reply, its
    # content parts joined as the template reads them.
    last = len(body.messages) - 1
    echo_text = ""
    if body.echo and body.messages[last].role == "assistant":
        echo_text = message_text(body.messages[last].content, last) or ""
    return await serve_generation(
        request, body, id_prefix="chatcmpl", prompts=[prompt],
        max_tokens=body.effective_max_tokens(), logprobs=chat_logprobs_count(body),
        renderer=functools.partial(ChatRenderer, tools=tools, reasoning=reasoning),
        submit_kwargs={"add_generation_prompt": body.add_generation_prompt,
                       "chat_template": body.chat_template,
                       "continue_final_message": body.continue_final_message,
                       "chat_template_kwargs": template_kwargs,
                       "add_special_tokens": body.add_special_tokens},
        echo=(lambda mux: {i: echo_text for i in range(body.n)}) if echo_text else None,
        # A stream has no place for them (vLLM accepts prompt_logprobs 0 there and returns
        # none): none are computed.
        prompt_logprobs=None if body.stream else body.prompt_logprobs)
