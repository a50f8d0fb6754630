"""The OpenAPI document as the server really answers, built from FastAPI's own.

FastAPI documents a 422 for every body (the server answers 400: OpenAI's format) and knows
nothing of the statuses raised as APIError (401, 404, 413, 429, 503) or of SSE streams. This
rewrites each operation's responses from what the routes do, so a client generated from the
spec, or schemathesis checking the server against it, sees no mismatch.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}
_ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}

_DESCRIPTIONS = {
    400: "Invalid request (malformed JSON, a field out of range, a prompt that cannot fit).",
    401: "Missing or wrong API key (only with --api-key).",
    404: "The model named in the request is not served here.",
    408: "The request's headers or body did not arrive in time (CADENCE_REQUEST_READ_TIMEOUT_S).",
    413: "Request body larger than --max-request-bytes.",
    431: "Request headers past the server's limits (count or bytes).",
    429: "Queue full (--max-num-queued-requests / --max-num-queued-tokens); see Retry-After.",
    500: "Generation failed inside the engine.",
    503: "The engine is unavailable (restarting or shutting down); see Retry-After.",
}

_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                "schema": {"type": "string"}}}

# Error statuses per operation, besides 401 which every protected operation can answer.
_GENERATION_ERRORS = (400, 404, 413, 429, 500, 503)
_OPERATION_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("/v1/completions", "post"): _GENERATION_ERRORS,
    ("/v1/chat/completions", "post"): _GENERATION_ERRORS,
    ("/v1/responses", "post"): _GENERATION_ERRORS,
    ("/v1/responses/{response_id}", "get"): (404,),
    ("/v1/models", "get"): (),
    ("/v1/models/{model_id}", "get"): (404,),
    ("/metrics", "get"): (),
    ("/health", "get"): (503,),
    ("/ping", "get"): (503,),
    ("/ping", "post"): (503,),
    ("/dashboard/plotly.min.js", "get"): (503,),
    ("/dashboard/events", "get"): (503,),
}
_PUBLIC_PATHS = ("/health", "/ping", "/version")
_STREAMING_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
# Operations whose 200 is not JSON (FastAPI cannot see what a handler's Response holds).
_CONTENT_TYPES = {
    "/metrics": "text/plain",
    "/dashboard": "text/html",
    "/dashboard/app.js": "text/javascript",
    "/dashboard/plotly.min.js": "text/javascript",
    "/dashboard/events": "text/event-stream",
}


# A text/event-stream body is documented per event (as OpenAPI 3.2 describes SSE and schema
# checkers validate it): each event has a `data` string (a JSON chunk, or `[DONE]`).
_SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}},
    "required": ["data"],
}


def _content_schema(media_type: str) -> dict[str, Any]:
    return {"schema": _SSE_EVENT_SCHEMA if media_type == "text/event-stream" else {"type": "string"}}


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS.get(status, "Error."),
        "content": {"application/json": {"schema": _ERROR_REF}},
    }
    if status in (429, 503):
        response["headers"] = _RETRY_AFTER
    return response


def build_openapi(app: FastAPI) -> dict[str, Any]:
    spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    spec.setdefault("components", {}).setdefault("schemas", {})["OpenAIError"] = _ERROR_SCHEMA
    for path, operations in spec.get("paths", {}).items():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            ok = responses.setdefault("200", {"description": "OK"})
            if path in _STREAMING_PATHS:
                ok.setdefault("content", {}).setdefault("text/event-stream", _content_schema("text/event-stream"))
            if path in _CONTENT_TYPES:
                ok["content"] = {_CONTENT_TYPES[path]: _content_schema(_CONTENT_TYPES[path])}
            statuses = set(_OPERATION_ERRORS.get((path, method), (400,) if "requestBody" in op
                                                 else ()))
            if path not in _PUBLIC_PATHS:
                statuses.add(401)
            statuses.add(431)  # any request's headers may pass the limits
            if "requestBody" in op:
                # Any body may be malformed, too large or too slow (408), may name a model
                # not served here (404), and may need the engine, which can be restarting (503).
                statuses.update((400, 404, 408, 413, 503))
            for status in sorted(statuses):
                responses[str(status)] = _error_response(status)
    return spec


def install_openapi(app: FastAPI) -> None:
    """Serve the rewritten document at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
