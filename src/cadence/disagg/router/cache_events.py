"""The router's subscriptions to its workers' KV cache events (cadence.disagg.kv_events).

A worker's event port is on its /metrics (cadence:kv_events_port, scraped by the router); the
router subscribes at the worker's host on that port, one SUB socket and task per worker, and
resubscribes when the port changes (a restarted worker). Each worker's CachedPrefixes is the
one ReplicaSelector reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from cadence.disagg.kv_events import TOPIC, CachedPrefixes

logger = logging.getLogger("cadence.router")


class CacheEventSubscriptions:
    def __init__(self, prefixes: dict[str, CachedPrefixes]) -> None:
        self.prefixes = prefixes  # worker url -> its cached prefixes (shared with the selector)
        self._context = zmq.asyncio.Context()
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}

    def ensure(self, worker_url: str, port: int) -> None:
        """Subscribe to `worker_url`'s events on `port` unless already (0: it publishes none)."""
        if port <= 0:
            return
        host = urlsplit(worker_url).hostname or "127.0.0.1"
        address = f"tcp://{host}:{port}"
        current = self._tasks.get(worker_url)
        if current is not None and current[0] == address:
            return
        if current is not None:
            current[1].cancel()
        prefixes = self.prefixes.setdefault(worker_url, CachedPrefixes())
        prefixes.forget()
        task = asyncio.get_running_loop().create_task(self._listen(address, prefixes))
        self._tasks[worker_url] = (address, task)

    async def _listen(self, address: str, prefixes: CachedPrefixes) -> None:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sock.connect(address)
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    prefixes.apply(json.loads(frames[-1]))
                except (ValueError, KeyError, TypeError) as exc:
                    logger.warning("bad KV event from %s: %r", address, exc)
                    prefixes.trusted = False
        finally:
            sock.close()

    async def close(self) -> None:
        for _, task in self._tasks.values():
            task.cancel()
        for _, task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._context.term()
