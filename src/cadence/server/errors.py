"""OpenAI-format errors: `{"error": {"message", "type", "param", "code"}}` for every failure.

Every 4xx/5xx the server answers, including FastAPI's own (validation, 404 route, 405), goes
through `install_error_handlers`, so clients only ever see this one shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# Seconds a client should wait before retrying a 429 (queue full) or a 503 (engine restarting).
RETRY_AFTER_S = {429: 1, 503: 5}

# HTTP status -> OpenAI error "type".
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}


def error_type_for(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


class APIError(Exception):
    """An error answered to the client in OpenAI format (raise it from any handler)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,  # noqa: A002 - the OpenAI field name
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code, self.type)

    def response(self) -> JSONResponse:
        return ErrorJSONResponse(self.body(), status_code=self.status,
                                 headers=error_headers(self.status, self.headers))


def error_headers(status: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The headers an error status promises: WWW-Authenticate on 401, Retry-After on 429/503."""
    headers = dict(extra or {})
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    return headers


class ErrorJSONResponse(JSONResponse):
    """A JSONResponse that renders any text: a message quoting the client's input may hold a
    lone surrogate (JSON allows "\\ud800"), which UTF-8 cannot encode; then it is escaped."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    type_: str | None = None,
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": type_ or error_type_for(status),
            "param": param,
            "code": code,
        }
    }


def _loc_to_param(loc: Sequence[Any]) -> str | None:
    # FastAPI prefixes body fields with "body"; unions add the member type name (e.g. "str").
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def validation_error_to_api_error(errors: Sequence[dict[str, Any]]) -> APIError:
    """Map pydantic/FastAPI validation errors to one 400 naming the first offending field."""
    if not errors:
        return APIError(400, "Invalid request body.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "JSON decode error")
        return APIError(400, f"Malformed JSON body: {detail}.", code="invalid_json")
    messages = []
    for err in errors[:5]:
        param = _loc_to_param(err.get("loc", ()))
        messages.append(f"{param or 'body'}: {err.get('msg', 'invalid value')}")
    param = _loc_to_param(first.get("loc", ()))
    if param is None and isinstance(first.get("input"), (bytes, bytearray)):
        # FastAPI hands the body over unparsed when its Content-Type is not JSON's (a form,
        # text/plain: curl -d sends a form's type): say so, not "a valid dictionary".
        return APIError(400, "The request body must be a JSON object sent with "
                        "'Content-Type: application/json'.", code="invalid_content_type")
    if first.get("type") == "unencodable_string":
        param = (first.get("ctx") or {}).get("param")
        return APIError(400, f"Invalid request: {first.get('msg')}.", param=param,
                        code="invalid_string")
    if param is not None and first.get("type") == "missing":
        code = "missing_required_parameter"
    else:
        code = "invalid_value"
    return APIError(400, "Invalid request: " + "; ".join(messages) + ".", param=param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    """Make FastAPI's own errors (422 validation, 404, 405, uncaught) answer in OpenAI format."""

    async def on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_to_api_error(exc.errors()).response()

    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "Error"
        message = exc.detail if isinstance(exc.detail, str) else phrase
        # Starlette's only 400 is a body it could not parse (e.g. JSON nested past the parser's
        # depth), which the client should hear as malformed JSON.
        code = "invalid_json" if exc.status_code == 400 else None
        # Keep Starlette's headers: 405 carries Allow.
        return APIError(exc.status_code, message, code=code,
                        headers=dict(exc.headers or {})).response()

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        return APIError(500, f"Internal server error: {type(exc).__name__}: {exc}").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
