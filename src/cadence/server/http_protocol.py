"""uvicorn's h11 protocol with OpenAI-format answers to requests h11 itself refuses.

A request h11 cannot parse never reaches the app: uvicorn answers a plain-text 400 and closes
at once. Two things change here:
- the answer is an OpenAI error body (431 for a header block past the size limit, which h11
  refuses while it is still arriving, else 400);
- the connection is closed gracefully: the response is sent, the write side shut, and what
  the client is still sending (the rest of a 1 MB header) is read and dropped for a moment
  before closing. Closing a socket with unread data makes the kernel send a reset, and a
  client that is still writing then never reads the response.
And one thing is added: a header block must arrive within `request_read_timeout_s` of the
connection or of the previous response (uvicorn has no such bound: headers sent a byte at a
time, or never finished, held the connection forever); past it the client gets a 408 in
OpenAI's format, or, if it sent nothing at all, the connection is closed.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from cadence.server.errors import APIError
from cadence.server.request_guard import (
    MAX_HEADER_BYTES, headers_too_large, request_read_timeout_s, request_timeout_error)

# How long a refused connection's remaining input is drained before the socket is closed.
DRAIN_S = 2.0


class GuardedH11Protocol(H11Protocol):
    """H11Protocol that answers unparseable requests in OpenAI's format (see module doc)."""

    _draining = False
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_header_block()

    def data_received(self, data: bytes) -> None:
        if self._draining:
            return  # the rest of a refused request: dropped
        super().data_received(data)
        self._watch_header_block()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_header_block()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _watch_header_block(self) -> None:
        """Arm the deadline while h11 waits for a request's headers (IDLE), from the first
        moment it does (later bytes do not extend it); disarm it once they are in."""
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(request_read_timeout_s(),
                                                             self._header_block_overdue)
        else:
            self._cancel_header_deadline()

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_block_overdue(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        buffered, _ = self.conn.trailing_data
        if not buffered:  # nothing sent since the connection (or the last response) opened
            self.transport.close()
            return
        # h11 cannot send a response to a request it has not parsed: the bytes are written
        # here, as its own 400 would be.
        self._write_and_close(request_timeout_error("header block"))

    def send_400_response(self, msg: str) -> None:
        buffered, _ = self.conn.trailing_data
        if len(buffered) > MAX_HEADER_BYTES:
            error = headers_too_large()
        else:
            error = APIError(400, f"{msg.rstrip('.')}: not a valid HTTP/1.1 request.",
                             code="invalid_http_request")
        self._write_and_close(error)

    def _write_and_close(self, error: APIError) -> None:
        """Answer `error` outside h11's request cycle, then close gracefully (module doc)."""
        self._cancel_header_deadline()
        body = error.response().body
        head = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
                "content-type: application/json", "connection: close",
                f"content-length: {len(body)}"]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body)
        self._draining = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(DRAIN_S, self.transport.close)
