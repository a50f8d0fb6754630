"""The waiting queue, in service order: FCFS or priority (lower value first, as vLLM)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from cadence.core.request import Request

RankKey = tuple[float, ...]


class WaitingQueue(Protocol):
    """Requests not running, in the order the scheduler should try to admit them."""

    def add(self, request: Request) -> None: ...

    def add_front(self, request: Request) -> None:
        """Put back a preempted request (first in line, as far as the order allows)."""

    def peek(self) -> Request: ...

    def pop(self) -> Request: ...

    def remove(self, request: Request) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSQueue:
    """First come, first served: add order, preempted requests to the very front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_front(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    """Sorted by a rank key ((priority, arrival_time, add order) from the scheduler).

    A preempted request keeps its key, so it goes back ahead of everything that ranks below it.
    """

    def __init__(self, rank: Callable[[Request], RankKey]) -> None:
        self._rank = rank
        self._keys: list[RankKey] = []
        self._requests: list[Request] = []

    def add(self, request: Request) -> None:
        key = self._rank(request)
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._requests.insert(i, request)

    def add_front(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._requests[0]

    def pop(self) -> Request:
        self._keys.pop(0)
        return self._requests.pop(0)

    def remove(self, request: Request) -> None:
        i = self._requests.index(request)
        del self._keys[i]
        del self._requests[i]

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)


def make_waiting_queue(scheduling: str, rank: Callable[[Request], RankKey]) -> WaitingQueue:
    if scheduling == "fcfs":
        return FCFSQueue()
    if scheduling == "priority":
        return PriorityQueue(rank)
    raise ValueError(f"unknown scheduling order {scheduling!r}")
