"""The prefill side's leases: finished requests' blocks kept for a decode engine to pull.

The engine thread owns the scheduler: it adds leases and frees their blocks (`take_releasable`
then `Scheduler.release_kv_lease`). The transport's server thread reads leased blocks and
records acknowledgements. A lease ends on the decode side's release (ack) or when it expires;
a lease whose blocks are being sent is never expired under the sender.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cadence.disagg.kv_blocks import KVLayout, block_runs, export_frames
from cadence.disagg.transport import KVTransferError


@dataclass
class Lease:
    block_ids: tuple[int, ...]
    expires_at: float
    busy: bool = False
    released: bool = False


class LeaseTable:
    """Thread-safe map req_id -> Lease over one KV cache storage tensor."""

    def __init__(self, storage: torch.Tensor, timeout_s: float,
                 notify: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.storage = storage
        self.layout = KVLayout.of(storage)
        self.timeout_s = timeout_s
        self._notify = notify
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self.bytes_served_total = 0
        self.num_expired_total = 0

    def __len__(self) -> int:
        return len(self._leases)

    # -- engine thread ----------------------------------------------------------------------
    def add(self, req_id: str, block_ids: Sequence[int]) -> None:
        with self._lock:
            self._leases[req_id] = Lease(tuple(block_ids), self._clock() + self.timeout_s)

    def take_releasable(self) -> tuple[list[str], list[str]]:
        """(acknowledged, expired) req ids whose blocks the engine must free now."""
        now = self._clock()
        acked, expired = [], []
        with self._lock:
            for req_id, lease in list(self._leases.items()):
                if lease.busy:
                    continue
                if lease.released:
                    acked.append(req_id)
                elif now >= lease.expires_at:
                    expired.append(req_id)
                else:
                    continue
                del self._leases[req_id]
        self.num_expired_total += len(expired)
        return acked, expired

    def seconds_to_next_expiry(self) -> float | None:
        with self._lock:
            if not self._leases:
                return None
            return max(0.0, min(lease.expires_at for lease in self._leases.values())
                       - self._clock())

    # -- transport server thread (KVSource) -------------------------------------------------
    def open_transfer(self, req_id: str, block_ids: Sequence[int]) -> tuple[dict, list]:
        with self._lock:
            lease = self._leases.get(req_id)
            if lease is None or lease.released:
                raise KVTransferError(f"no live lease for request {req_id} (expired or freed)")
            if not set(block_ids) <= set(lease.block_ids):
                raise KVTransferError(f"blocks {list(block_ids)} are not leased by {req_id}")
            lease.busy = True
        header = {"runs": [list(r) for r in block_runs(block_ids)],
                  "layout": self.layout.to_dict()}
        return header, export_frames(self.storage, block_ids)

    def close_transfer(self, req_id: str, num_bytes: int) -> None:
        with self._lock:
            lease = self._leases.get(req_id)
            if lease is not None:
                lease.busy = False
            self.bytes_served_total += num_bytes

    def release(self, req_id: str) -> bool:
        with self._lock:
            lease = self._leases.get(req_id)
            if lease is None:
                return False
            lease.released = True
        self._notify()
        return True
