"""The KV transport: how a decode engine pulls leased blocks from a prefill engine.

The interface is small on purpose (pull, release), so an RDMA library (Mooncake's transfer
engine, NIXL) can replace ZeroMQ on GPU clusters: `KVTransport` is the decode side, `KVSource`
is what the prefill side exposes to the transport's server.

ZeroMQ implementation (CPU, TCP or IPC): the prefill side binds a ROUTER socket served by a
thread; a request is one JSON frame, a pull's answer is a JSON header frame followed by the
blocks' bytes as separate frames, each a view of the cache sent without copying
(`copy=False`); the thread waits until ZeroMQ is done with those views before it lets the lease
go. The decode side's DEALER receives the frames without copying either (kv_blocks.py scatters
them into its cache).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq


class KVTransferError(RuntimeError):
    """A pull or release failed: unreachable engine, timeout, unknown or expired lease."""


@dataclass
class KVPayload:
    """A pull's answer: header (runs, layout) and the received frames (zero-copy buffers)."""

    header: dict[str, Any]
    buffers: list[memoryview]
    num_bytes: int
    seconds: float
    # Keeps the zmq frames (owners of the buffers) alive as long as the payload.
    _frames: list[Any] = field(default_factory=list, repr=False)


class KVTransport(Protocol):
    """Decode side: ask a prefill engine for blocks, then let it free them."""

    def pull(self, address: str, remote_req_id: str, block_ids: Sequence[int],
             timeout_s: float) -> KVPayload: ...

    def release(self, address: str, remote_req_id: str, timeout_s: float) -> None: ...

    def close(self) -> None: ...


class KVSource(Protocol):
    """Prefill side, as the transport's server sees it (leases.LeaseTable + the cache)."""

    def open_transfer(self, req_id: str, block_ids: Sequence[int]) -> tuple[dict, list[memoryview]]:
        """Header and frames of leased blocks; marks the lease busy. Raises KVTransferError."""
        ...

    def close_transfer(self, req_id: str, num_bytes: int) -> None: ...

    def release(self, req_id: str) -> bool: ...


# ---- ZeroMQ ------------------------------------------------------------------------------------


class ZmqKVServer:
    """Serves a KVSource on `address` (tcp://host:port or ipc://path) from its own thread."""

    POLL_MS = 100

    def __init__(self, address: str, source: KVSource, context: zmq.Context | None = None,
                 send_timeout_s: float = 30.0) -> None:
        self.source = source
        self.send_timeout_s = send_timeout_s
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if address.startswith("tcp://") and address.endswith(":0"):
            port = self._socket.bind_to_random_port(address.rsplit(":", 1)[0])
            address = f"{address.rsplit(':', 1)[0]}:{port}"
        else:
            self._socket.bind(address)
        self.address = address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cadence-kv-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        sock = self._socket
        try:
            while not self._stop.is_set():
                if not sock.poll(self.POLL_MS, zmq.POLLIN):
                    continue
                ident, _, body = sock.recv_multipart()
                try:
                    request = json.loads(body)
                    self._handle(ident, request)
                except Exception as exc:  # a bad request must not kill the server thread
                    self._reply(ident, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            sock.close()

    def _reply(self, ident: bytes, header: dict, frames: Sequence[memoryview] = ()) -> list:
        parts: list[Any] = [ident, b"", json.dumps(header).encode()]
        trackers = []
        for buf in frames:
            frame = zmq.Frame(buf, copy=False, track=True)
            trackers.append(frame.tracker)
            parts.append(frame)
        self._socket.send_multipart(parts, copy=False)
        return trackers

    def _handle(self, ident: bytes, request: dict) -> None:
        op, req_id = request.get("op"), str(request.get("req_id"))
        if op == "release":
            self._reply(ident, {"ok": bool(self.source.release(req_id))})
        elif op == "pull":
            try:
                header, frames = self.source.open_transfer(req_id, list(request["block_ids"]))
            except KVTransferError as exc:
                self._reply(ident, {"ok": False, "error": str(exc)})
                return
            num_bytes = sum(f.nbytes for f in frames)
            try:
                trackers = self._reply(ident, {"ok": True, **header}, frames)
                deadline = time.monotonic() + self.send_timeout_s
                for tracker in trackers:  # the views must stay valid until ZeroMQ is done
                    if tracker is not None:
                        tracker.wait(max(0.0, deadline - time.monotonic()))
            finally:
                self.source.close_transfer(req_id, num_bytes)
        else:
            self._reply(ident, {"ok": False, "error": f"unknown op {op!r}"})


class ZmqKVTransport:
    """Decode side over ZeroMQ: one DEALER per prefill address. One thread uses it."""

    def __init__(self, context: zmq.Context | None = None) -> None:
        self._context = context or zmq.Context.instance()
        self._sockets: dict[str, zmq.Socket] = {}

    def _socket(self, address: str) -> zmq.Socket:
        sock = self._sockets.get(address)
        if sock is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            self._sockets[address] = sock
        return sock

    def _drop(self, address: str) -> None:
        # After a timeout the answer may still come: a fresh socket never mixes it up.
        sock = self._sockets.pop(address, None)
        if sock is not None:
            sock.close()

    def _request(self, address: str, request: dict, timeout_s: float) -> tuple[dict, list]:
        sock = self._socket(address)
        sock.send_multipart([b"", json.dumps(request).encode()])
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            self._drop(address)
            raise KVTransferError(f"no answer from the prefill engine at {address} within "
                                  f"{timeout_s:.1f}s ({request['op']} of {request['req_id']})")
        parts = sock.recv_multipart(copy=False)
        header = json.loads(parts[1].bytes)
        if not header.get("ok"):
            raise KVTransferError(f"prefill engine at {address} refused {request['op']} of "
                                  f"{request['req_id']}: {header.get('error', 'no reason')}")
        return header, parts[2:]

    def pull(self, address: str, remote_req_id: str, block_ids: Sequence[int],
             timeout_s: float) -> KVPayload:
        start = time.perf_counter()
        header, frames = self._request(
            address, {"op": "pull", "req_id": remote_req_id, "block_ids": list(block_ids)},
            timeout_s)
        buffers = [f.buffer for f in frames]
        return KVPayload(header, buffers, sum(b.nbytes for b in buffers),
                         time.perf_counter() - start, frames)

    def release(self, address: str, remote_req_id: str, timeout_s: float) -> None:
        self._request(address, {"op": "release", "req_id": remote_req_id}, timeout_s)

    def close(self) -> None:
        for address in list(self._sockets):
            self._drop(address)
