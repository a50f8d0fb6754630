"""KV cache events: a worker tells routers which prefix blocks it holds, over ZeroMQ PUB/SUB.

Why events rather than a summary the router polls: a multi-turn conversation's next turn often
arrives within a second of the previous answer, and by then the answer's blocks are cached;
a poll period long enough to be cheap would miss them. Deltas go out on the engine thread's
turn as blocks are cached and evicted (BlockPool.cache_events), so the router's view lags the
cache by one engine turn. PUB/SUB drops messages while a subscriber joins or falls behind, so
every message carries a sequence number and the whole set goes out as a snapshot every
`snapshot_interval_s`: a subscriber that saw a gap (or just connected) trusts the worker's set
again from the next snapshot, and until then routes by its own record (session affinity).

One message is one JSON frame after the topic frame b"kv":
    {"engine_id", "seq", "block_size", "kind": "snapshot" | "delta",
     "stored": [hex hash, ...], "removed": [hex hash, ...]}
Hashes are the engine's chained block hashes (cadence.core.block_hash), so a router that hashes
a request's token ids with the same block size finds the longest prefix a worker holds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import zmq

from cadence.core.block_hash import leading_blocks_held

TOPIC = b"kv"


class KVEventPublisher:
    """Worker side: binds a PUB socket; `publish(pool)` once per engine turn."""

    def __init__(self, address: str, engine_id: str, block_size: int, pool: Any,
                 context: zmq.Context, snapshot_interval_s: float = 2.0) -> None:
        self.engine_id = engine_id
        self.block_size = block_size
        self.pool = pool
        self.snapshot_interval_s = snapshot_interval_s
        # XPUB, not PUB: it hands us each subscription as it arrives, so a router that just
        # connected (or reconnected) gets a snapshot at this worker's next turn instead of up
        # to snapshot_interval_s later; until then it can only route by session affinity.
        self.socket = context.socket(zmq.XPUB)
        self.socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscribe, not only the first
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 10000)
        self.socket.bind(address)
        self.address = self.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        pool.cache_events = []
        self.seq = 0
        self._next_snapshot = 0.0

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1]) if self.address.startswith("tcp://") else 0

    def publish(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        events = self.pool.cache_events
        self.pool.cache_events = []
        if self._new_subscriber():
            self._next_snapshot = now
        if now >= self._next_snapshot:
            self._next_snapshot = now + self.snapshot_interval_s
            self._send("snapshot", [h.hex() for h in self.pool.cached_hashes()], [])
        elif events:
            self._send("delta", [h.hex() for stored, h in events if stored],
                       [h.hex() for stored, h in events if not stored])

    def _new_subscriber(self) -> bool:
        """Whether a subscription arrived since the last turn (XPUB's b"\\x01" + topic)."""
        joined = False
        while True:
            try:
                message = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return joined
            joined = joined or message[:1] == b"\x01"

    def _send(self, kind: str, stored: list[str], removed: list[str]) -> None:
        self.seq += 1
        body = {"engine_id": self.engine_id, "seq": self.seq, "block_size": self.block_size,
                "kind": kind, "stored": stored, "removed": removed}
        try:
            self.socket.send_multipart([TOPIC, json.dumps(body).encode()], zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeps up: it will see the gap and wait for a snapshot

    def close(self) -> None:
        self.pool.cache_events = None
        self.socket.close()


class CachedPrefixes:
    """Router side: one worker's prefix blocks as its events say (`trusted` once a snapshot
    arrived with no gap since)."""

    def __init__(self) -> None:
        self.hashes: set[bytes] = set()
        self.block_size: int | None = None
        self.engine_id: str | None = None
        self.seq = 0
        self.trusted = False
        self.last_message = 0.0

    def apply(self, message: dict[str, Any]) -> None:
        self.last_message = time.monotonic()
        seq = int(message["seq"])
        if message.get("engine_id") != self.engine_id:  # a restarted worker: a new sequence
            self.engine_id, self.trusted = message.get("engine_id"), False
        elif seq != self.seq + 1:
            self.trusted = False
        self.seq = seq
        self.block_size = int(message["block_size"])
        if message["kind"] == "snapshot":
            self.hashes = {bytes.fromhex(h) for h in message["stored"]}
            self.trusted = True
            return
        self.hashes.update(bytes.fromhex(h) for h in message["stored"])
        self.hashes.difference_update(bytes.fromhex(h) for h in message["removed"])

    def forget(self) -> None:
        self.hashes.clear()
        self.trusted = False

    def longest_prefix_blocks(self, block_hashes: list[bytes]) -> int:
        """Leading blocks of a request held here (the hashes chain: the first miss ends it)."""
        return leading_blocks_held(block_hashes, self.hashes.__contains__)
