"""vLLM's POST /invocations (SageMaker's inference route): a body with `messages` is a chat
completion, any other a completion, validated and answered exactly as on /v1/chat/completions
or /v1/completions."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from cadence.server.errors import APIError
from cadence.server.protocol import ChatCompletionRequest, CompletionRequest
from cadence.server.serving_chat import create_chat_completion
from cadence.server.serving_completions import create_completion


async def invocations(request: Request) -> Response:
    try:
        data = await request.json()
    except ValueError as exc:
        raise APIError(400, f"Malformed JSON body: {exc}.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "The body must be a JSON object: a chat completion (with "
                       "'messages') or a completion request.", code="invalid_value")
    chat = "messages" in data
    try:
        body = (ChatCompletionRequest if chat else CompletionRequest).model_validate(data)
    except ValidationError as exc:  # answered as the route's own validation errors are
        raise RequestValidationError(exc.errors()) from exc
    if chat:
        return await create_chat_completion(body, request)
    return await create_completion(body, request)
