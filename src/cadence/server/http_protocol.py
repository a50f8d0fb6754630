"""uvicorn's h11 protocol with OpenAI-format answers to requests h11 itself refuses.

A request h11 cannot parse never reaches the app: uvicorn answers a plain-text 400 and closes
at once. Two things change here:
- the answer is an OpenAI error body (431 for a header block past the size limit, which h11
  refuses while it is still arriving, else 400);
- the connection is closed gracefully: the response is sent, the write side shut, and what
  the client is still sending (the rest of a 1 MB header) is read and dropped for a moment
  before closing. Closing a socket with unread data makes the kernel send a reset, and a
  client that is still writing then never reads the response.
"""

from __future__ import annotations

from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from cadence.server.errors import APIError
from cadence.server.request_guard import MAX_HEADER_BYTES, headers_too_large

# How long a refused connection's remaining input is drained before the socket is closed.
DRAIN_S = 2.0


class GuardedH11Protocol(H11Protocol):
    """H11Protocol that answers unparseable requests in OpenAI's format (see module doc)."""

    _draining = False

    def data_received(self, data: bytes) -> None:
        if self._draining:
            return  # the rest of a refused request: dropped
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        buffered, _ = self.conn.trailing_data
        if len(buffered) > MAX_HEADER_BYTES:
            error = headers_too_large()
        else:
            error = APIError(400, f"{msg.rstrip('.')}: not a valid HTTP/1.1 request.",
                             code="invalid_http_request")
        response = error.response()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(response.body)).encode())]
        self.transport.write(self.conn.send(h11.Response(
            status_code=error.status, headers=headers,
            reason=HTTPStatus(error.status).phrase.encode())))
        self.transport.write(self.conn.send(h11.Data(data=response.body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self._draining = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(DRAIN_S, self.transport.close)
