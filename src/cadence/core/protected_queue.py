"""The scheduler's waiting queue, protecting each waiting request's cached prefix.

A request waiting behind a full KV pool would otherwise lose the prefix blocks it is about to
reuse to the allocations of the requests running meanwhile: the pool evicts the least recently
freed cached block, and a waiting request's prefix (a conversation's history, freed when its
previous turn ended) is often that block. A cache-aware router sent the request to this replica
for that prefix. Every way into the queue (a new request, a preempted one put back) protects
the request's prefix (KVCacheManager.protect_prefix); every way out (admitted, aborted, failed)
releases it, so the pool's protection counts are exactly the waiting requests'.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.request import Request
from cadence.core.request_queue import WaitingQueue


class PrefixProtectingQueue:
    """A WaitingQueue (FCFS or priority) whose members protect their cached prefixes in `kv`."""

    def __init__(self, queue: WaitingQueue, kv: KVCacheManager) -> None:
        self._queue = queue
        self._kv = kv

    def add(self, request: Request) -> None:
        self._queue.add(request)
        self._kv.protect_prefix(request)

    def add_front(self, request: Request) -> None:
        self._queue.add_front(request)
        self._kv.protect_prefix(request, front=True)

    def peek(self) -> Request:
        return self._queue.peek()

    def pop(self) -> Request:
        request = self._queue.pop()
        self._kv.release_protection(request)
        return request

    def remove(self, request: Request) -> None:
        self._queue.remove(request)
        self._kv.release_protection(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)
