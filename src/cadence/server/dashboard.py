"""`/dashboard`: a live page of the engine's steps, streams, stalls and their causes.

Routes (all behind the API key when the server has one):
    GET /dashboard                 the page (static HTML + JS in dashboard_static/)
    GET /dashboard/plotly.min.js   the charting library, read from the installed `plotly` wheel
                                   (the server may be offline: never a CDN)
    GET /dashboard/app.js          the page's own script
    GET /dashboard/events          Server-Sent Events: a snapshot, then batched live events

A browser's EventSource cannot send an Authorization header, so the dashboard also takes the
key as `?key=` on the page (which then sets an HttpOnly cookie for the page's own requests).
Events are coalesced: at most `EVENT_INTERVAL_S` apart, so a viewer costs the front end a few
JSON encodes a second whatever the step rate.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse

from cadence.server.errors import APIError

EVENT_INTERVAL_S = 0.25
HEARTBEAT_S = 10.0
COOKIE = "cadence_dashboard_key"


def check_dashboard_key(request: Request) -> None:
    """The API key from the Authorization header, the dashboard cookie or `?key=`."""
    expected: str | None = request.app.state.server.config.api_key
    if expected is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    candidates = [token.strip() if scheme.lower() == "bearer" else "",
                  request.cookies.get(COOKIE, ""), request.query_params.get("key", "")]
    if not any(c and hmac.compare_digest(c.encode(), expected.encode()) for c in candidates):
        raise APIError(401, "Missing or incorrect API key: open /dashboard?key=<key> or send "
                       "'Authorization: Bearer <key>'.", code="invalid_api_key")


router = APIRouter(dependencies=[Depends(check_dashboard_key)])


def _static(name: str) -> str:
    return importlib.resources.files("cadence.server").joinpath("dashboard_static", name).read_text(
        encoding="utf-8")


@router.get("/dashboard")
async def dashboard_page(request: Request) -> Response:
    response = HTMLResponse(_static("dashboard.html"))
    key = request.query_params.get("key")
    if key and request.app.state.server.config.api_key is not None:
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/dashboard")
    return response


@router.get("/dashboard/app.js")
async def dashboard_script() -> Response:
    return Response(_static("dashboard.js"), media_type="text/javascript")


@router.get("/dashboard/plotly.min.js")
async def plotly_script() -> Response:
    try:
        path = importlib.resources.files("plotly").joinpath("package_data", "plotly.min.js")
    except ModuleNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise APIError(503, "The dashboard's charting library is missing: pip install plotly "
                       "(scripts/setup.sh installs it).", code="dashboard_unavailable")
    return FileResponse(str(path), media_type="text/javascript",
                        headers={"Cache-Control": "max-age=86400"})


@router.get("/dashboard/events")
async def dashboard_events(request: Request) -> StreamingResponse:
    live = request.app.state.server.telemetry
    if live is None:
        raise APIError(503, "The engine is not available.", code="engine_unavailable")

    async def stream() -> AsyncIterator[str]:
        viewer = live.subscribe()
        try:
            yield _sse(live.snapshot())
            last_beat = time.monotonic()
            while not live.closing and not await request.is_disconnected():
                try:
                    await asyncio.wait_for(viewer.wakeup.wait(), timeout=HEARTBEAT_S)
                except asyncio.TimeoutError:
                    pass
                if live.closing:
                    break  # server shutdown: end the stream so uvicorn can stop
                events = viewer.drain()
                if events:
                    yield _sse({"kind": "batch", "now": time.monotonic(), "events": events,
                                "stats": live.last_stats, "dropped": viewer.dropped})
                elif time.monotonic() - last_beat >= HEARTBEAT_S:
                    yield ": keep-alive\n\n"
                last_beat = time.monotonic()
                await asyncio.sleep(EVENT_INTERVAL_S)  # coalesce: a few messages a second
        finally:
            live.unsubscribe(viewer)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
