"""POST /v1/responses (OpenAI's Responses API, as vLLM serves it) on the chat path.

    body -> responses_mapping.chat_body -> serve_generation(..., ResponsesRenderer)

The chat route's prompt, sampling, structured output and tool-call readers serve it; only the
output format differs: a `response` object whose `output` holds a reasoning item (with
--reasoning-parser: one reasoning_text part, first), a message item (one output_text part)
and function_call items, or, streamed, named SSE events:

    response.created, response.in_progress,
    per item: response.output_item.added,
        reasoning:      response.content_part.added, response.reasoning_text.delta...,
                        response.reasoning_text.done, response.content_part.done
        message:        response.content_part.added, response.output_text.delta...,
                        response.output_text.done, response.content_part.done
        function_call:  response.function_call_arguments.delta..., ...arguments.done
    response.output_item.done; then response.completed (its status "incomplete" when
    max_output_tokens cut the reply), each with a rising sequence_number; no [DONE].

With include ["message.output_text.logprobs"] the output_text part and its delta / done
events carry the output text's token logprobs (responses_logprobs.py: only the text's tokens,
never the reasoning's or a function call's).

Responses are kept in memory (responses_store.py) unless store is false, so a later request
can continue one with previous_response_id; GET /v1/responses/{id} returns one.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from cadence.engine.outputs import RequestOutput
from cadence.engine.wire import TokenLogprob
from cadence.server.errors import APIError
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol_responses import ResponsesRequest
from cadence.server.request_mapping import chat_prompt, reject_unsupported
from cadence.server.reasoning_parsers import ReasoningMode, reasoning_mode
from cadence.server.reasoning_stream import Piece, ReasoningSplitter, split_pieces
from cadence.server.responses_mapping import (RESPONSES_PARAM, append_tool_call,
                                              attach_reasoning, chat_body, input_messages)
from cadence.server.responses_logprobs import (ContentTokens, event_logprobs, part_logprobs,
                                               text_prefix_tokens, without_stop_token)
from cadence.server.responses_store import ResponseStore
from cadence.server.serving import ResponseContext, serve_generation
from cadence.server.sse import sse_named_event
from cadence.server.token_ids import logprobs_as_token_ids
from cadence.server.tool_choice import ToolMode, tool_mode
from cadence.server.tool_streaming import ARGS, CONTENT, START, new_call_id


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_object(num_input: int, num_output: int, num_cached: int,
                 num_reasoning: int = 0) -> dict[str, Any]:
    return {"input_tokens": num_input, "input_tokens_details": {"cached_tokens": num_cached},
            "output_tokens": num_output,
            "output_tokens_details": {"reasoning_tokens": num_reasoning},
            "total_tokens": num_input + num_output}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """vLLM's reasoning output item: the model's reasoning as one reasoning_text part, no
    summary."""
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [reasoning_part(text)], "encrypted_content": None, "status": status}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, text: str, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [text_part(text, logprobs)]}


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An output_text part; `logprobs`: its tokens' (responses_logprobs.part_logprobs), with
    include ["message.output_text.logprobs"]."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat turns a follow-up request continues from."""
    messages: list[dict[str, Any]] = []
    reasoning = None
    for item in output:
        if item["type"] == "reasoning":
            reasoning = item["content"][0]["text"]
            continue
        if item["type"] == "message":
            messages.append({"role": "assistant", "content": item["content"][0]["text"]})
        else:
            append_tool_call(messages, item["call_id"], item["name"], item["arguments"])
        attach_reasoning(messages, reasoning)
        reasoning = None
    return messages


def request_echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings a response object repeats (OpenAI's fields, their defaults)."""
    return {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls
        is not False, "previous_response_id": body.previous_response_id,
        "temperature": body.temperature, "top_p": body.top_p,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}},
        "truncation": "disabled", "store": body.store is not False, "background": False,
        "reasoning": body.reasoning, "service_tier": body.service_tier, "user": body.user,
        # vLLM's: the alternatives computed per token (None without the logprobs include)
        "top_logprobs": body.output_logprobs(),
    }


class ResponsesRenderer:
    """One response of the Responses API: the whole object, or its stream of events."""

    chunk_object = "response"
    stream_end = ""  # the Responses stream ends with response.completed, no [DONE]

    def __init__(self, ctx: ResponseContext, echo: dict[str, Any], tools: ToolMode | None,
                 conversation: list[dict[str, Any]], store: ResponseStore | None,
                 reasoning: ReasoningMode | None = None) -> None:
        self.ctx = ctx
        # "resp-<hex>" (or "resp-<client request id>") -> OpenAI's "resp_..." spelling.
        self.response_id = ctx.req_id.replace("-", "_", 1)
        self.echo = echo
        self.tools = tools
        self.conversation = conversation  # the messages a stored response continues from
        self.store = store
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # items, as they stand
        self._open: dict[str, Any] | None = None  # the item receiving text, if any
        self._reader = tools.new_stream() if tools is not None else None
        # With a reasoning parser: the reply's reasoning becomes a reasoning item, first.
        self.reasoning = reasoning.format if reasoning is not None else None
        self._splitter = ReasoningSplitter(self.reasoning) if self.reasoning else None
        # With the logprobs include: which generated tokens are output text, and those not
        # sent yet (the splitter and the tool reader hold text back, so a token's entry rides
        # on the next output_text.delta; tokens a function call took are dropped).
        self._content_tokens = ContentTokens(self.reasoning) if ctx.want_logprobs else None
        self._pending: list[TokenLogprob] = []
        self._called = False  # a function call started: later tokens are not output text

    def _logprob_entries(self, entries: list[TokenLogprob]) -> list[TokenLogprob]:
        return logprobs_as_token_ids(entries) if self.ctx.tokens_as_ids else entries

    def frame_event(self, event: dict[str, Any]) -> str:
        return sse_named_event(event)

    def response_object(self, status: str, usage: dict[str, Any] | None,
                        incomplete_reason: str | None = None) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": self.ctx.created,
                "status": status, "error": None,
                "incomplete_details": ({"reason": incomplete_reason} if incomplete_reason
                                       else None),
                "model": self.ctx.model, "output": [dict(item) for item in self._output],
                "usage": usage, **self.echo}

    def _finish(self, finish_reason: str | None, usage: dict[str, Any]) -> tuple[str, dict]:
        incomplete = finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        response = self.response_object(status, usage,
                                        "max_output_tokens" if incomplete else None)
        if self.store is not None:
            self.store.put(self.response_id,
                           self.conversation + output_messages(response["output"]), response)
        return status, response

    # -- whole response --------------------------------------------------------------------

    def whole_response(self, results: list[CollectedGeneration],
                       usage: dict[str, Any]) -> dict[str, Any]:
        result = results[0]
        status = "incomplete" if result.finish_reason == "length" else "completed"
        reasoning, reply, num_reasoning = None, result.text, 0
        if self.reasoning is not None:
            reasoning, reply, num_reasoning = split_pieces(self.reasoning, result.pieces)
            if reasoning is not None:
                self._output.append(reasoning_item(_item_id("rs"), reasoning, status))
        content, calls = (self.tools.whole(reply) if self.tools is not None and reply
                          else (reply, []))
        logprobs = None
        if self._content_tokens is not None:
            generated = without_stop_token(result.logprobs, result.finish_reason,
                                           result.stop_reason)
            tokens = self._content_tokens.feed(generated) + self._content_tokens.finish()
            if calls:
                tokens = text_prefix_tokens(tokens, content or "")
            logprobs = part_logprobs(self._logprob_entries(tokens))
        if content or not calls:
            self._output.append(message_item(_item_id("msg"), content or "", status, logprobs))
        self._output += [function_call_item(_item_id("fc"), new_call_id(), c.name,
                                            c.arguments, "completed") for c in calls]
        details = usage.get("prompt_tokens_details") or {}
        return self._finish(result.finish_reason, usage_object(
            usage["prompt_tokens"], usage["completion_tokens"],
            details.get("cached_tokens", 0), num_reasoning))[1]

    # -- stream ----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def opening_chunks(self, index: int) -> list[dict[str, Any]]:
        events = [self._event("response.created",
                              response=self.response_object("in_progress", None)),
                  self._event("response.in_progress",
                              response=self.response_object("in_progress", None))]
        if self.tools is None and self.reasoning is None:  # plain text: the message opens
            events += self._open_message()
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        return self._open_text_item(message_item(_item_id("msg"), "", "in_progress"),
                                    text_part(""))

    def _open_reasoning(self) -> list[dict[str, Any]]:
        return self._open_text_item(reasoning_item(_item_id("rs"), "", "in_progress"),
                                    reasoning_part(""))

    def _open_text_item(self, item: dict[str, Any], part: dict[str, Any]) -> list[dict[str, Any]]:
        """Open an output item whose one content part streams text (a message's output_text,
        a reasoning item's reasoning_text): its added events, the part still empty."""
        item["content"] = []
        self._output.append(item)
        self._open = item
        where = {"item_id": item["id"], "output_index": len(self._output) - 1}
        return [self._event("response.output_item.added", output_index=where["output_index"],
                            item=dict(item, content=[])),
                self._event("response.content_part.added", **where, content_index=0,
                            part=part)]

    def _open_call(self, name: str, call_id: str) -> list[dict[str, Any]]:
        item = function_call_item(_item_id("fc"), call_id or new_call_id(), name, "",
                                  "in_progress")
        self._output.append(item)
        self._open = item
        return [self._event("response.output_item.added", output_index=len(self._output) - 1,
                            item=dict(item))]

    def _close_open(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = self._output.index(item)
        where = {"item_id": item["id"], "output_index": index}
        events = []
        if item["type"] == "message":
            text = item.pop("_text", "")
            tokens = self._logprob_entries(item.pop("_tokens", []))
            item["content"] = [text_part(text, part_logprobs(tokens))]
            events += [self._event("response.output_text.done", **where, content_index=0,
                                   text=text, logprobs=event_logprobs(tokens)),
                       self._event("response.content_part.done", **where, content_index=0,
                                   part=text_part(text, part_logprobs(tokens)))]
        elif item["type"] == "reasoning":
            text = item.pop("_text", "")
            item["content"] = [reasoning_part(text)]
            events += [self._event("response.reasoning_text.done", **where, content_index=0,
                                   text=text),
                       self._event("response.content_part.done", **where, content_index=0,
                                   part=reasoning_part(text))]
        else:
            events.append(self._event("response.function_call_arguments.done", **where,
                                      name=item["name"], arguments=item["arguments"]))
            status = "completed"  # a call the reader let out is whole
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=index,
                                  item=dict(item)))
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close_open("completed") + self._open_message()
        item = self._open
        item["_text"] = item.get("_text", "") + text
        tokens, self._pending = self._pending, []
        item.setdefault("_tokens", []).extend(tokens)
        events.append(self._event("response.output_text.delta", item_id=item["id"],
                                  output_index=self._output.index(item), content_index=0,
                                  delta=text,
                                  logprobs=event_logprobs(self._logprob_entries(tokens))))
        return events

    def _reasoning_text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close_open("completed") + self._open_reasoning()
        item = self._open
        item["_text"] = item.get("_text", "") + text
        events.append(self._event("response.reasoning_text.delta", item_id=item["id"],
                                  output_index=self._output.index(item), content_index=0,
                                  delta=text))
        return events

    def _split(self, out: RequestOutput) -> Piece:
        if self._splitter is None:
            return Piece("", out.new_text)
        piece = self._splitter.feed(out.new_text, len(out.new_token_ids))
        return piece + self._splitter.finish() if out.finished else piece

    def _take_tokens(self, out: RequestOutput) -> None:
        """This output's output-text tokens join those waiting for a text delta."""
        found = self._content_tokens
        if found is None:
            return
        generated = out.logprobs or ()
        if out.finished:
            generated = without_stop_token(generated, out.finish_reason, out.stop_reason)
        tokens = found.feed(generated) + (found.finish() if out.finished else [])
        if not self._called:
            self._pending += tokens

    def output_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self._take_tokens(out)
        piece = self._split(out)
        if piece.reasoning:
            events += self._reasoning_text(piece.reasoning)
        if self._reader is None:
            if piece.content:
                events += self._text(piece.content)
        else:
            pieces = self._reader.feed(piece.content) if piece.content else []
            if out.finished:
                pieces += self._reader.finish()
            for piece in pieces:
                if piece.kind == CONTENT and piece.text:
                    events += self._text(piece.text)
                elif piece.kind == START:
                    # what waits is the call's own text: not output text, nor what follows
                    self._called, self._pending = True, []
                    events += self._close_open("completed") + self._open_call(piece.name,
                                                                              piece.call_id)
                elif piece.kind == ARGS and self._open is not None:
                    self._open["arguments"] += piece.text
                    events.append(self._event("response.function_call_arguments.delta",
                                              item_id=self._open["id"],
                                              output_index=self._output.index(self._open),
                                              delta=piece.text))
        if out.finished:
            if self._pending and self._open is not None and self._open["type"] == "message":
                events += self._text("")  # tokens of no text (a stop token's): the last delta
            item_status = "incomplete" if out.finish_reason == "length" else "completed"
            if all(item["type"] == "reasoning" for item in self._output):
                # no answer came: an empty message, as OpenAI answers
                events += self._close_open(item_status) + self._open_message()
            events += self._close_open(item_status)
            num_reasoning = self._splitter.reasoning_tokens if self._splitter else 0
            _, response = self._finish(out.finish_reason, usage_object(
                out.num_prompt_tokens, out.num_output_tokens,
                min(out.num_cached_tokens, out.num_prompt_tokens), num_reasoning))
            # response.completed even when cut (its status says incomplete), as vLLM sends it:
            # the SDK's stream helper takes its final response from that event only.
            events.append(self._event("response.completed", response=response))
        return events


def _store_of(request: Request) -> ResponseStore:
    return request.app.state.server.responses


async def create_response(body: ResponsesRequest, request: Request) -> Response:
    reject_unsupported(body.unsupported_features())
    store = _store_of(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = store.get(body.previous_response_id)
        if stored is None:
            raise APIError(404, f"Response with id '{body.previous_response_id}' not found "
                           "(responses are kept in memory, bounded, and only with store "
                           "not false).", param="previous_response_id", code="not_found")
        history = list(stored.messages)
    # The input mapped once: the chat request and the conversation stored with the response.
    turn = input_messages(body.input)
    chat = chat_body(body, history, turn)
    config = request.app.state.server.config
    tools = tool_mode(chat.tools, chat.tool_choice, config.tool_call_parser)
    template_kwargs = chat.template_variables()
    reasoning = reasoning_mode(config.reasoning_parser, template_kwargs,
                               grammar=chat.structured_outputs_spec() is not None)
    conversation = history + turn
    renderer = functools.partial(ResponsesRenderer, echo=request_echo(body), tools=tools,
                                 conversation=conversation,
                                 store=store if body.store is not False else None,
                                 reasoning=reasoning)
    try:
        return await serve_generation(
            request, chat, id_prefix="resp", prompts=[chat_prompt(chat)],
            max_tokens=chat.effective_max_tokens(), logprobs=body.output_logprobs(),
            renderer=renderer,
            submit_kwargs={"add_generation_prompt": True,
                           "chat_template_kwargs": template_kwargs,
                           "add_special_tokens": False})
    except APIError as exc:
        # The chat path names its own fields; the client sent the Responses API's.
        if exc.param is not None:
            head, _, rest = exc.param.partition(".")
            if head in RESPONSES_PARAM:
                exc.param = RESPONSES_PARAM[head] + ("." + rest if rest else "")
        raise


async def retrieve_response(response_id: str, request: Request) -> JSONResponse:
    """GET /v1/responses/{id}: a stored response as it was answered."""
    stored = _store_of(request).get(response_id)
    if stored is None:
        raise APIError(404, f"Response with id '{response_id}' not found.",
                       param="response_id", code="not_found")
    return JSONResponse(stored.response)
