"""Bearer API-key check (active only when the server was started with --api-key)."""

from __future__ import annotations

import hmac

from fastapi import Request

from cadence.server.errors import APIError


def check_api_key(request: Request) -> None:
    """FastAPI dependency: 401 in OpenAI format unless `Authorization: Bearer <key>` matches."""
    expected: str | None = request.app.state.server.config.api_key
    if expected is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key")
    # Constant-time compare: the key must not leak through response timing.
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
