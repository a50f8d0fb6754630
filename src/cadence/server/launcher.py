"""Run the app under uvicorn with a graceful shutdown that never drops a stream silently.

On SIGINT/SIGTERM uvicorn stops accepting connections and waits for open ones to finish. The
in-flight requests get `shutdown_grace_s` to complete; what is still running then is aborted in
the engine, so each open stream ends with finish_reason "abort" (and [DONE]) instead of a cut
connection. Then the lifespan stops the engine process.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import uvicorn

from cadence.engine.engine_process import EngineProcessConfig
from cadence.server.app import ServerState, create_app
from cadence.server.config import ServerConfig
from cadence.server.http_protocol import GuardedH11Protocol
from cadence.server.request_guard import MAX_HEADER_BYTES

logger = logging.getLogger("cadence.server")


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose shutdown aborts the engine's live requests after a grace period."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float) -> None:
        super().__init__(config)
        self._state = state
        self._grace_s = grace_s

    async def _abort_after_grace(self) -> None:
        await asyncio.sleep(self._grace_s)
        client = self._state.client
        if client is not None and client.num_live_requests:
            logger.warning("shutdown: aborting %d in-flight requests", client.num_live_requests)
            await client.abort_all(reason="shutdown")

    async def shutdown(self, sockets: Any = None) -> None:
        if self._state.telemetry is not None:
            self._state.telemetry.close_viewers()  # open /dashboard/events streams end now
        aborter = asyncio.create_task(self._abort_after_grace())
        try:
            await super().shutdown(sockets)
        finally:
            aborter.cancel()


def run_server(config: ServerConfig, engine_config: EngineProcessConfig,
               log_level: str = "info") -> int:
    """Serve until SIGINT/SIGTERM (blocking); the process exit code (non-zero after the engine
    died with --exit-on-engine-death)."""
    # The front end is asyncio + JSON: one thread; the cores belong to the engine process.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _configure_logging(log_level)
    app = create_app(config, engine_config)
    # uvicorn's access log ("127.0.0.1 - POST /v1/completions 200") with --enable-log-requests.
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                               access_log=config.enable_log_requests, lifespan="on",
                               # h11 (not httptools) with a bounded header block, refused in
                               # OpenAI's format (http_protocol.py).
                               http=GuardedH11Protocol,
                               h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                               root_path=config.root_path)
    state: ServerState = app.state.server
    server = GracefulServer(uv_config, state, config.shutdown_grace_s)
    exit_code = 0

    def request_exit(code: int) -> None:
        nonlocal exit_code
        exit_code = code
        server.should_exit = True

    state.request_exit = request_exit
    try:
        server.run()
    except KeyboardInterrupt:
        # uvicorn re-raises the SIGINT it captured once its graceful shutdown is done (and a
        # second Ctrl-C lands here too): the shutdown already happened, so no traceback.
        pass
    if exit_code == 0 and not server.started:
        exit_code = 1  # startup failed (the engine did not come up)
    return exit_code


def _configure_logging(log_level: str) -> None:
    """cadence's own log lines (startup summary, request log) next to uvicorn's."""
    root = logging.getLogger("cadence")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     [%(name)s] %(message)s"))
        root.addHandler(handler)
    level = "DEBUG" if log_level == "trace" else log_level.upper()
    root.setLevel(level)
    root.propagate = False
