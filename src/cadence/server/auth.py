"""Bearer API-key check (active only when the server was started with --api-key).

The RequestGuard middleware checks the key before the body is read; this dependency keeps
routes outside its prefixes covered too."""

from __future__ import annotations

from fastapi import Request

from cadence.server.request_guard import api_key_error


def check_api_key(request: Request) -> None:
    """FastAPI dependency: 401 in OpenAI format unless `Authorization: Bearer <key>` matches."""
    expected: str | None = request.app.state.server.config.api_key
    if expected is None:
        return
    error = api_key_error(request.headers.get("authorization", ""), expected)
    if error is not None:
        raise error
