"""RequestGuard: the checks that must run before a request body is parsed (pure ASGI).

    client -> RequestGuard: API key (401), body size (413) -> FastAPI: JSON, pydantic, handler

FastAPI reads and decodes the JSON body before it runs route dependencies, so an auth check
written as a dependency answers a malformed body with 400 before 401, and nothing bounds the
body: a 50 MB prompt would be read, decoded and validated in full. The guard answers first:
the key is checked from the headers alone, and the body is read here, incrementally, up to
`max_request_bytes` (a Content-Length past it is refused without reading anything), then
replayed to the app. Later `receive` calls (disconnect detection while streaming) go to the
server as before.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadence.server.errors import APIError

# Paths that need the API key (when one is set): the OpenAI API and the metrics.
PROTECTED_PREFIXES = ("/v1/", "/metrics")


def api_key_error(authorization: str, expected: str) -> APIError | None:
    """The 401 for an `Authorization` header value, or None when it carries `expected`."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return APIError(401, "Missing API key: send 'Authorization: Bearer <key>'.",
                        code="invalid_api_key")
    # Constant-time compare: the key must not leak through response timing.
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return None


def _too_large(limit: int) -> APIError:
    return APIError(413, f"Request body too large: the limit is {limit} bytes "
                    "(--max-request-bytes).", code="request_too_large")


class RequestGuard:
    """ASGI middleware: API key and body-size limit before the app sees the request."""

    def __init__(self, app: ASGIApp, max_request_bytes: int,
                 api_key: Callable[[], str | None]) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self._api_key = api_key  # read per request: the app's config owns it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        expected = self._api_key()
        if expected is not None and scope["path"].startswith(PROTECTED_PREFIXES):
            error = api_key_error(headers.get("authorization", ""), expected)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_request_bytes:
            await _too_large(self.max_request_bytes).response()(scope, receive, send)
            return
        body = await self._read_body(receive)
        if body is None:
            await _too_large(self.max_request_bytes).response()(scope, receive, send)
            return
        if isinstance(body, dict):  # the client left while sending
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | Message | None:
        """The whole body; None once it passes the limit; the disconnect message if any."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
