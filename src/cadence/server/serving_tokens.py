"""POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's), GET /version: the engine's
tokenizer over HTTP.

The bodies take the checks every route's body takes (protocol.APIRequest) and the size limits
of the generation routes: a text that could not fit the context, or more token ids than the
context holds, is a 400 before the engine sees it, so the tokenizer's work is bounded.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, model_validator

from cadence import __version__
from cadence.engine.async_client import EngineDeadError, EngineRejected
from cadence.engine.chat_render import chat_template_kwargs_problem
from cadence.server.errors import APIError
from cadence.server.request_mapping import message_text
from cadence.server.protocol import (APIRequest, ChatMessage, ReasoningEffort,
                                     chat_template_variables)
from cadence.server.request_mapping import EnginePrompt, check_model, check_prompt_size
from cadence.server.tool_choice import tool_functions


class TokenizeRequest(APIRequest):
    """Either `prompt` (text) or `messages` (a chat, rendered with the chat template)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # vLLM's defaults: true for a text, false for a chat (its template writes them).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    # Extra chat-template variables (vLLM's), so a chat counts as its completion renders it.
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's too: the request's own template, the last (assistant) message left open, the
    # tools the template lists (as a chat completion passes them), the vocabulary pieces.
    chat_template: str | None = None
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False
    # A chat completion's other template variables (cadence's: vLLM's /tokenize lacks them), so
    # a RAG or reasoning chat counts, and the cache-aware router hashes, what its completion runs.
    documents: list[dict[str, str]] | None = None
    reasoning_effort: ReasoningEffort | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' and 'messages'")
        if self.prompt is not None and (self.chat_template is not None or self.tools
                                        or self.continue_final_message
                                        or self.documents is not None
                                        or self.reasoning_effort is not None):
            raise ValueError("chat_template, continue_final_message, tools, documents and "
                             "reasoning_effort go with 'messages'")
        if (why := chat_template_kwargs_problem(self.chat_template_kwargs)) is not None:
            raise ValueError(why)
        return self


class DetokenizeRequest(APIRequest):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    tokens: list[int] = Field(min_length=0)


async def _ask_engine(request: Request, **fields: Any) -> dict[str, Any]:
    server = request.app.state.server
    try:
        return await server.client.tokenize(**fields)
    except EngineRejected as exc:
        raise APIError(exc.status, exc.message, param=exc.param, code=exc.code) from exc
    except EngineDeadError as exc:
        raise APIError(503, f"The engine is unavailable: {exc}", code="engine_unavailable") from exc
    except TimeoutError as exc:  # alive but busy: not "unavailable"
        raise APIError(503, "The engine did not answer in time; retry later.",
                       code="engine_timeout") from exc


async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    server = request.app.state.server
    check_model(body.model, server.model_name, server.model_names)
    if body.messages is not None:
        if body.tools:
            tool_functions(body.tools)  # malformed tools: the chat route's 400, here too
        if body.continue_final_message:  # the chat route's checks, naming the same field
            if body.add_generation_prompt:
                raise APIError(400, "continue_final_message needs add_generation_prompt=false",
                               param="continue_final_message")
            if not body.messages or body.messages[-1].role != "assistant":
                raise APIError(400, "continue_final_message needs a final assistant message",
                               param="continue_final_message")
        # Content parts as chat reads them (one template input, one token count; a non-text
        # part is chat's 400 here too).
        messages = [{"role": m.role, "content": message_text(m.content, i) or ""}
                    for i, m in enumerate(body.messages)]
        check_prompt_size(EnginePrompt(chat_messages=messages), server.max_model_len,
                          server.max_token_chars)
        template_kwargs = chat_template_variables(body.tools, body.chat_template_kwargs,
                                                  body.documents, body.reasoning_effort)
        reply = await _ask_engine(request, messages=messages,
                                  add_generation_prompt=body.add_generation_prompt,
                                  chat_template_kwargs=template_kwargs,
                                  chat_template=body.chat_template,
                                  continue_final_message=body.continue_final_message,
                                  add_special_tokens=bool(body.add_special_tokens),
                                  return_token_strs=body.return_token_strs)
    else:
        check_prompt_size(EnginePrompt(text=body.prompt), server.max_model_len,
                          server.max_token_chars)
        reply = await _ask_engine(request, text=body.prompt,
                                  add_special_tokens=body.add_special_tokens is not False,
                                  return_token_strs=body.return_token_strs)
    tokens = reply["tokens"]
    answer = {"count": len(tokens), "max_model_len": server.max_model_len, "tokens": tokens}
    if body.return_token_strs:
        answer["token_strs"] = reply["token_strs"]
    return JSONResponse(answer)


async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    server = request.app.state.server
    check_model(body.model, server.model_name, server.model_names)
    if len(body.tokens) > server.max_model_len:
        raise APIError(400, f"{len(body.tokens)} token ids are more than this model's context "
                       f"holds ({server.max_model_len}).", param="tokens",
                       code="context_length_exceeded")
    if any(t < 0 for t in body.tokens):
        raise APIError(400, "token ids must be >= 0.", param="tokens", code="invalid_token_id")
    reply = await _ask_engine(request, token_ids=body.tokens)
    return JSONResponse({"prompt": reply["text"]})


async def tokenizer_info(request: Request) -> JSONResponse:
    """The served tokenizer's special tokens and chat template (sent once at engine start):
    lm-evaluation-harness's remote tokenizer needs `eos_token` here, then uses /tokenize."""
    info = request.app.state.server.client.info.tokenizer_info
    if not info:
        raise APIError(404, "This engine serves no tokenizer.", code="no_tokenizer")
    return JSONResponse(info)


async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})
