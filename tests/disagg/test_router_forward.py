"""The router's relay of a decode worker's stream, over a mock transport: the request leaves
the worker's in-flight count when its [DONE] passes, before the client reads it (a client that
sends its next request on [DONE] must find the worker idle, or the auto policy sees a stream
that is gone), exactly once; a stream cut before [DONE] ends with an error event naming the
worker, and the count is back to zero too."""

from __future__ import annotations

import asyncio

import httpx

from cadence.disagg.router.forward import Forwarder
from cadence.disagg.router.workers import WorkerPool

EVENTS = [b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "b"}]}\n\n',
          b"data: [DONE]\n\n"]


def _relay(events: list[bytes]) -> tuple[list[tuple[bytes, int, int]], WorkerPool]:
    async def body():
        for event in events:
            yield event

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=body())

    async def run():
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        pool = WorkerPool("decode", ("http://decode",))
        worker = pool.workers[0]
        response = await Forwarder(client, 1.0).relay(pool, "/v1/completions",
                                                      {"stream": True}, 100)
        seen = []
        async for chunk in response.body_iterator:
            seen.append((chunk, worker.outstanding_requests, worker.outstanding_tokens))
        await client.aclose()
        return seen, pool

    return asyncio.run(run())


def test_stream_leaves_the_count_when_done_passes():
    seen, pool = _relay(EVENTS)
    worker = pool.workers[0]
    assert b"".join(c for c, _, _ in seen) == b"".join(EVENTS)
    done = [i for i, (c, _, _) in enumerate(seen) if b"[DONE]" in c]
    assert len(done) == 1
    # Token events are relayed while the request counts; the chunk with [DONE] after it left.
    assert all(n == 1 and t == 100 for _, n, t in seen[:done[0]])
    assert seen[done[0]][1:] == (0, 0)
    assert (worker.outstanding_requests, worker.outstanding_tokens) == (0, 0)
    assert worker.healthy


def test_stream_cut_before_done_is_an_explicit_error():
    seen, pool = _relay(EVENTS[:2])
    worker = pool.workers[0]
    tail = seen[-1][0]
    assert b"decode worker http://decode failed mid-stream" in tail and tail.endswith(
        b"data: [DONE]\n\n")
    assert (worker.outstanding_requests, worker.outstanding_tokens) == (0, 0)
    assert not worker.healthy and worker.failures == 1
