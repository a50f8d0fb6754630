"""The decode side's transfer thread: pulls leased blocks, then releases the leases.

The engine thread submits jobs and, once per loop turn, takes the finished pulls (the frames
are scattered into the cache on the engine thread, which owns the blocks: an aborted request's
late frames are simply dropped). Each finished job wakes the engine loop through `notify`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cadence.disagg.transport import KVPayload, KVTransferError, KVTransport

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PullJob:
    req_id: str
    address: str
    remote_req_id: str
    remote_block_ids: tuple[int, ...]


@dataclass
class PullResult:
    req_id: str
    payload: KVPayload | None
    error: str | None = None


class KVPuller:
    """One thread running the KVTransport for the engine (pulls first-come first-served)."""

    def __init__(self, transport_factory: Callable[[], KVTransport], timeout_s: float,
                 notify: Callable[[], None]) -> None:
        self._factory = transport_factory
        self.timeout_s = timeout_s
        self._notify = notify
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="cadence-kv-puller", daemon=True)
        self._thread.start()

    def pull(self, job: PullJob) -> None:
        self._jobs.put(("pull", job))

    def release(self, address: str, remote_req_id: str) -> None:
        self._jobs.put(("release", (address, remote_req_id)))

    def take_results(self) -> list[PullResult]:
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._jobs.put(("stop", None))
        self._thread.join(5)

    def _run(self) -> None:
        transport = self._factory()
        try:
            while True:
                kind, job = self._jobs.get()
                if kind == "stop":
                    return
                if kind == "release":
                    address, remote_req_id = job
                    try:
                        transport.release(address, remote_req_id, self.timeout_s)
                    except KVTransferError as exc:  # the lease expires on its own
                        logger.warning("KV release failed: %s", exc)
                    continue
                try:
                    payload = transport.pull(job.address, job.remote_req_id,
                                             job.remote_block_ids, self.timeout_s)
                    result = PullResult(job.req_id, payload)
                except KVTransferError as exc:
                    result = PullResult(job.req_id, None, str(exc))
                except Exception as exc:  # keep the thread alive whatever happened
                    logger.exception("KV pull of %s failed", job.req_id)
                    result = PullResult(job.req_id, None, f"{type(exc).__name__}: {exc}")
                self._results.put(result)
                self._notify()
        finally:
            transport.close()


