"""A tiny OpenAI-compatible streaming server for the bench tests.

It simulates one device: a step costs `decode_step_s + prefill_s_per_token * prefill tokens in
the step` and gives every decoding request one token (and a request whose prefill completes its
first token). `eager` prefills every waiting prompt whole in one step, so a long prompt visibly
stalls the streams already decoding (what the interference analysis must detect); `chunked`
serves decodes first and fills the rest of `budget` tokens with prompt chunks. Prompt tokens are whitespace-separated words.
Knobs: several tokens per SSE chunk (listed in logprobs.tokens), requests rejected with HTTP 400,
streams cut midway, and a /metrics endpoint with cadence: gauges.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


@dataclass(frozen=True)
class FakeServerConfig:
    decode_step_s: float = 0.004
    policy: str = "eager"
    budget: int = 512
    prefill_s_per_token: float = 0.0
    tokens_per_chunk: int = 1
    # By order of arrival (0 = first request received).
    reject_arrivals: tuple[int, ...] = ()
    cut_arrivals: tuple[int, ...] = ()
    cut_after_tokens: int = 3
    kv_capacity_tokens: int = 10_000
    model: str = "fake-model"
    metrics: bool = True


@dataclass
class _Stream:
    prompt_tokens: int
    max_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    emitted: int = 0
    prefilled: int = 0


class _Engine:
    """The simulated step loop (runs in the server's event loop)."""

    def __init__(self, cfg: FakeServerConfig, registry: CollectorRegistry):
        self.cfg = cfg
        self.waiting: deque[_Stream] = deque()
        self.running: list[_Stream] = []
        self.wakeup = asyncio.Event()
        self.kv = Gauge("cadence:kv_cache_usage_perc", "KV usage", registry=registry)
        self.num_running = Gauge("cadence:num_requests_running", "running", registry=registry)
        self.num_waiting = Gauge("cadence:num_requests_waiting", "waiting", registry=registry)
        self.preemptions = Counter("cadence:num_preemptions", "preemptions", registry=registry)

    def submit(self, stream: _Stream) -> None:
        self.waiting.append(stream)
        self._publish()
        self.wakeup.set()

    def _publish(self) -> None:
        used = sum(s.prompt_tokens + s.emitted for s in self.running)
        self.kv.set(min(used / self.cfg.kv_capacity_tokens, 1.0))
        self.num_running.set(len(self.running))
        self.num_waiting.set(len(self.waiting))

    async def loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            self.running.extend(self.waiting)
            self.waiting.clear()
            self._publish()
            decoding = [s for s in self.running if s.prefilled == s.prompt_tokens]
            prefilling = [s for s in self.running if s.prefilled < s.prompt_tokens]
            left = self.cfg.budget - len(decoding) if self.cfg.policy == "chunked" else None
            step_prefill = 0
            for s in prefilling:
                n = s.prompt_tokens - s.prefilled if left is None else min(s.prompt_tokens - s.prefilled, max(left, 0))
                s.prefilled += n
                step_prefill += n
                if left is not None:
                    left -= n
            await asyncio.sleep(self.cfg.decode_step_s + self.cfg.prefill_s_per_token * step_prefill)
            for s in self.running:
                if s.prefilled == s.prompt_tokens:
                    s.emitted += 1
                    s.queue.put_nowait(s.emitted)
            self.running = [s for s in self.running if s.emitted < s.max_tokens]
            self._publish()


def build_app(cfg: FakeServerConfig) -> FastAPI:
    registry = CollectorRegistry()
    state = {"arrivals": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = _Engine(cfg, registry)
        app.state.engine = engine
        task = asyncio.create_task(engine.loop())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": cfg.model, "object": "model"}]}

    if cfg.metrics:
        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(generate_latest(registry).decode())

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        arrival = state["arrivals"]
        state["arrivals"] += 1
        if arrival in cfg.reject_arrivals:
            return JSONResponse(status_code=400, content={"error": {"message": "prompt rejected by fake server", "type": "invalid_request_error"}})
        stream = _Stream(prompt_tokens=len(body["prompt"].split()), max_tokens=int(body["max_tokens"]))
        request.app.state.engine.submit(stream)
        cut = arrival in cfg.cut_arrivals
        with_logprobs = cfg.tokens_per_chunk > 1 or body.get("logprobs") is not None

        async def events():
            sent = 0
            while sent < stream.max_tokens:
                group = []
                while len(group) < cfg.tokens_per_chunk and sent + len(group) < stream.max_tokens:
                    group.append(await stream.queue.get())
                sent += len(group)
                if cut and sent >= cfg.cut_after_tokens:
                    raise RuntimeError("fake server cuts this stream")
                choice = {"index": 0, "text": "".join(f" t{n}" for n in group),
                          "finish_reason": "length" if sent == stream.max_tokens else None}
                if with_logprobs:
                    choice["logprobs"] = {"tokens": [f" t{n}" for n in group]}
                yield f"data: {json.dumps({'object': 'text_completion', 'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": stream.prompt_tokens, "completion_tokens": sent, "total_tokens": stream.prompt_tokens + sent}
            yield f"data: {json.dumps({'object': 'text_completion', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class FakeServer:
    """Run the fake app with uvicorn in a background thread; `url` once started."""

    def __init__(self, cfg: FakeServerConfig = FakeServerConfig()):
        self.cfg = cfg
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(cfg), log_level="critical", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
