"""RequestGuard: the checks that must run before a request body is parsed (pure ASGI).

    client -> RequestGuard: headers (431), API key (401), body size (413)
           -> FastAPI: JSON, pydantic (protocol.APIRequest), handler

FastAPI reads and decodes the JSON body before it runs route dependencies, so an auth check
written as a dependency answers a malformed body with 400 before 401, and nothing bounds the
body: a 50 MB prompt would be read, decoded and validated in full. The guard answers first:
the key is checked from the headers alone, and the body is read here, incrementally, up to
`max_request_bytes` (a Content-Length past it is refused without reading anything), then
replayed to the app. Later `receive` calls (disconnect detection while streaming) go to the
server as before. Every route needs the key except the few that are public by design (health,
version, the API document) and the dashboard, which checks its own (it takes the key from the
page's query string too); so no route reads a body before the key is checked.

Headers are bounded twice: h11 refuses a header block it has not finished receiving past
MAX_HEADER_BYTES (http_protocol.py answers that in OpenAI's format), and the guard refuses a
complete one past MAX_HEADER_BYTES or MAX_HEADERS (431) before anything else reads it.

Both are bounded in time too (`request_read_timeout_s`, nginx's 60 s client_header_timeout /
client_body_timeout): uvicorn waits forever for a header block or a body that never ends, so a
client announcing a Content-Length it never sends, or sending headers a byte at a time, held a
connection and its task for good. The header block's deadline is http_protocol.py's; the
body's is here: 408 in OpenAI's format, and the connection closed.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadence.server.errors import APIError

# Paths that never need the API key: liveness, the version, the API document (and its
# viewers). The dashboard's pages check the key themselves (header or ?key=).
PUBLIC_PATHS = frozenset(("/health", "/ping", "/version", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc"))
DASHBOARD_PREFIX = "/dashboard"

# Header limits (gunicorn's defaults are 100 fields of 8190 bytes; nginx's buffers 4 x 8 KiB):
# real clients send a few hundred bytes of headers.
MAX_HEADERS = 100
MAX_HEADER_BYTES = 32 * 1024


# Seconds a request's header block, and then its body, may take to arrive (each on its own).
DEFAULT_REQUEST_READ_TIMEOUT_S = 60.0


def request_read_timeout_s() -> float:
    """The header-block and body deadline: CADENCE_REQUEST_READ_TIMEOUT_S, else 60 s."""
    value = os.environ.get("CADENCE_REQUEST_READ_TIMEOUT_S")
    return float(value) if value else DEFAULT_REQUEST_READ_TIMEOUT_S


def request_timeout_error(what: str) -> APIError:
    return APIError(408, f"The request's {what} did not arrive within "
                    f"{request_read_timeout_s():g} s.", code="request_timeout",
                    headers={"Connection": "close"})


def needs_api_key(path: str) -> bool:
    return path not in PUBLIC_PATHS and not (
        path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/"))


def header_limit_error(headers: list[tuple[bytes, bytes]]) -> APIError | None:
    """The 431 for a header block past MAX_HEADERS fields or MAX_HEADER_BYTES, else None."""
    if len(headers) > MAX_HEADERS:
        return APIError(431, f"Too many request headers: {len(headers)} (the limit is "
                        f"{MAX_HEADERS}).", code="request_headers_too_large")
    size = sum(len(k) + len(v) + 4 for k, v in headers)  # "k: v\r\n"
    if size > MAX_HEADER_BYTES:
        return headers_too_large()
    return None


def headers_too_large() -> APIError:
    return APIError(431, f"Request headers too large: the limit is {MAX_HEADER_BYTES} bytes.",
                    code="request_headers_too_large")


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
        raw_headers = scope.get("headers", [])
        error = header_limit_error(raw_headers)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
        expected = self._api_key()
        if expected is not None and needs_api_key(scope["path"]):
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
        try:
            body = await asyncio.wait_for(self._read_body(receive), request_read_timeout_s())
        except asyncio.TimeoutError:
            await request_timeout_error("body").response()(scope, receive, send)
            return
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
