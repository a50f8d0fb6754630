"""EngineSupervisor: keeps an engine behind the server, respawning it when it dies.

    start()  -> the first engine (a failure here fails the server's startup)
    watch()  -> waits for the engine to stop; unless the server is shutting down:
                gauges reset, then respawn (backoff 0.5 s .. 10 s) or, with
                --exit-on-engine-death, ask the server to exit non-zero

While there is no live engine, the generation routes answer 503 with Retry-After
(cadence.server.app) and /health answers 503. The dead engine's requests already ended with an
explicit error when its client's reader noticed the death (AsyncEngineClient fails them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cadence.engine.async_client import AsyncEngineClient, EngineDeadError
from cadence.engine.engine_process import EngineProcessConfig

logger = logging.getLogger("cadence.server")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class EngineSupervisor:
    """Owns the engine client of `state` (a cadence.server.app.ServerState)."""

    def __init__(self, state: Any, engine_config: EngineProcessConfig, *, in_process: bool,
                 exit_on_death: bool, request_exit: Callable[[int], None] | None = None) -> None:
        self.state = state
        self.engine_config = engine_config
        self.in_process = in_process
        self.exit_on_death = exit_on_death
        # How to stop the whole server with an exit code (the launcher sets it).
        self.request_exit = request_exit
        self.num_restarts = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> AsyncEngineClient:
        client = await AsyncEngineClient.start(self.engine_config, in_process=self.in_process)
        self.state.client = client
        self._task = asyncio.create_task(self._watch(), name="cadence-engine-supervisor")
        return client

    async def stop(self) -> None:
        """Stop supervising and shut the engine down (server shutdown)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self.state.client is not None:
            await self.state.client.shutdown()

    async def _watch(self) -> None:
        while not self._stopping:
            client: AsyncEngineClient = self.state.client
            await client.wait_stopped()
            if self._stopping or (client.is_closing and client.dead_reason is None):
                return
            reason = client.dead_reason or "engine stopped"
            logger.error("engine died: %s", reason)
            if self.state.metrics is not None:
                self.state.metrics.engine_down()
            # Release the dead engine's sockets, process and IPC folder.
            await client.shutdown(timeout_s=1.0)
            if self.exit_on_death:
                logger.error("exiting (--exit-on-engine-death)")
                if self.request_exit is not None:
                    self.request_exit(1)
                return
            await self._respawn()

    async def _respawn(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self._stopping:
            try:
                client = await AsyncEngineClient.start(self.engine_config,
                                                       in_process=self.in_process)
            except (EngineDeadError, OSError) as exc:
                logger.error("engine restart failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            if self._stopping:
                await client.shutdown()
                return
            self.num_restarts += 1
            if self.state.metrics is not None:
                # The same sink the first engine fed (the live telemetry wraps the metrics).
                client.attach_metrics(getattr(self.state, "telemetry", None) or self.state.metrics)
                self.state.metrics.engine_up(self.num_restarts)
            self.state.client = client
            logger.warning("engine restarted (restart #%d)", self.num_restarts)
            return
