"""RequestStream: one request's outputs as an async iterator, fed by the engine client's reader.

The client's reader task puts each RequestOutput (or the exception that ended the engine) on
the request's queue; the stream hands them out until the one with finished=True. Closing the
stream before that tells the client to abort the request in the engine (frees its KV blocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from cadence.engine.outputs import RequestOutput


class RequestState:
    """What the client's reader routes to one request: its admission, then its outputs."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.accepted: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()


class RequestStream:
    """Async iterator over one request's outputs; closing it early aborts the request."""

    def __init__(self, req_id: str, accepted: Mapping[str, Any], state: RequestState,
                 on_close: Callable[[bool], None]) -> None:
        """`accepted` is the engine's admission record; `on_close(abort)` is called once, by
        close(), with abort=True when the request had not finished."""
        self._state = state
        self._on_close = on_close
        self.req_id = req_id
        self.num_prompt_tokens: int = accepted["num_prompt_tokens"]
        self.prompt_text: str | None = accepted.get("prompt_text")
        # With want_prompt_token_ids (vLLM's return_token_ids): the ids the engine runs.
        self.prompt_token_ids: list[int] | None = accepted.get("prompt_token_ids")
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._state.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def close(self) -> None:
        """Stop listening; if the request is still running, abort it (frees its KV blocks)."""
        abort = not self.finished
        self.finished = True
        self._on_close(abort)

    async def aclose(self) -> None:
        self.close()
