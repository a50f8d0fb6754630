"""The router's HTTP calls to workers, and what it does when a worker fails.

    prefill(...)  POST the request with kv_transfer_params {"do_remote_decode": true} and
                  stream=false to a prefill worker; returns its handoff. A worker that cannot be
                  reached or answers 5xx is skipped (marked failed for a while) and the next one
                  is tried; None when none could prefill (the caller falls back to colocated).
    relay(...)    POST to a decode worker and pass its answer through byte for byte (SSE or
                  JSON). A worker that cannot be reached before it answered is replaced by the
                  next one (a handed-off request can be pulled by any decode worker while its
                  lease lives). A worker that dies mid-stream ends the stream with an explicit
                  error event naming the worker, then [DONE]: tokens already sent cannot be
                  taken back, so the request is not re-run.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cadence.disagg.router.workers import Outstanding, Worker, WorkerPool

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_json(status: int, message: str, code: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def sse_error(message: str, code: str) -> bytes:
    return (f"data: {json.dumps(error_json(502, message, code))}\n\n"
            "data: [DONE]\n\n").encode()


@dataclass
class Handoff:
    worker: Worker
    kv_transfer_params: dict[str, Any] | None  # None: finished at its first token
    num_prompt_tokens: int
    num_cached_tokens: int
    seconds: float
    worker_was_idle: bool


class Forwarder:
    def __init__(self, client: httpx.AsyncClient, cooldown_s: float,
                 headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.cooldown_s = cooldown_s
        self.headers = headers or {}

    async def prefill(self, pool: WorkerPool, path: str, body: dict[str, Any],
                      tokens: int) -> Handoff | Response | None:
        """The handoff, an error Response to give the client (4xx: a bad request), or None."""
        payload = {**body, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        payload.pop("stream_options", None)
        for worker in pool.candidates():
            idle = worker.outstanding_requests == 0
            start = time.perf_counter()
            with Outstanding(worker, tokens):
                try:
                    resp = await self.client.post(worker.url + path, json=payload,
                                                  headers=self.headers)
                except httpx.HTTPError:
                    worker.mark_failed(self.cooldown_s)
                    continue
            if resp.status_code >= 500:
                worker.mark_failed(self.cooldown_s)
                continue
            if resp.status_code != 200:
                return Response(resp.content, status_code=resp.status_code,
                                media_type="application/json")
            answer = resp.json()
            usage = answer.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            return Handoff(worker, answer.get("kv_transfer_params"),
                           int(usage.get("prompt_tokens", 0)), int(cached or 0),
                           time.perf_counter() - start, idle)
        return None

    async def relay(self, pool: WorkerPool, path: str, body: dict[str, Any], tokens: int,
                    on_done=None, order: list[Worker] | None = None,
                    work: Callable[[Worker], int] | None = None) -> Response:
        """Forward to the decode pool and pass the answer through (see module docstring).
        `order`: the workers to try, best first (default: the pool's least loaded first);
        `work`: the tokens the request costs on a worker (default: all of `tokens`)."""
        stream = bool(body.get("stream"))
        tried: set[str] = set()

        def candidates() -> list[Worker]:
            if order is None:
                return pool.candidates(exclude=tried)
            return [w for w in order if w.url not in tried]

        while True:
            order_now = candidates()
            if not order_now:
                return JSONResponse(error_json(
                    503, f"no decode worker could take the request (tried {sorted(tried)})",
                    "no_worker_available"), status_code=503)
            worker = order_now[0]
            tried.add(worker.url)
            counter = Outstanding(worker, tokens, work(worker) if work is not None else None)
            counter.__enter__()
            try:
                request = self.client.build_request("POST", worker.url + path, json=body,
                                                    headers=self.headers)
                resp = await self.client.send(request, stream=True)
            except httpx.HTTPError:
                counter.__exit__()
                worker.mark_failed(self.cooldown_s)
                continue
            if resp.status_code >= 500 and candidates():
                await resp.aclose()
                counter.__exit__()
                worker.mark_failed(self.cooldown_s)
                continue
            if stream and resp.status_code == 200:
                return StreamingResponse(
                    self._pass_stream(resp, worker, counter, on_done),
                    media_type="text/event-stream", headers=SSE_HEADERS)
            try:
                content = await resp.aread()
            except httpx.HTTPError as exc:
                worker.mark_failed(self.cooldown_s)
                return JSONResponse(error_json(
                    502, f"decode worker {worker.url} failed before it answered: {exc!r}",
                    "decode_worker_failed"), status_code=502)
            finally:
                await resp.aclose()
                counter.__exit__()
            if on_done is not None and resp.status_code == 200:
                on_done(content)
            return Response(content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"))

    async def _pass_stream(self, resp: httpx.Response, worker: Worker, counter: Outstanding,
                           on_done) -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in resp.aiter_raw():
                if not complete and b"data: [DONE]" in chunk:
                    complete = True
                    # The request is over before the client reads [DONE]: one that sends its
                    # next request on [DONE] must not find this one still counted in flight
                    # (the auto policy would see a stream to protect that is gone).
                    counter.__exit__()
                yield chunk
            if not complete:
                raise httpx.RemoteProtocolError("stream ended without [DONE]")
        except httpx.HTTPError as exc:
            worker.mark_failed(self.cooldown_s)
            yield sse_error(f"decode worker {worker.url} failed mid-stream ({exc!r}); the "
                            "request ended with the tokens above and was not re-run",
                            "decode_worker_failed")
        finally:
            await resp.aclose()
            counter.__exit__()
            if on_done is not None:
                on_done(None)
