"""AsyncEngineClient: the front end's handle on the engine core (own process or thread).

    client = await AsyncEngineClient.start(EngineProcessConfig(...))
    stream = await client.submit(req_id, prompt_text="Hello", sampling={...})  # raises on reject
    async for out in stream: ...          # RequestOutput, the last one has finished=True
    await client.shutdown()

One reader task receives the engine's batches and routes each output to its request's queue
(cadence.engine.request_stream); closing a stream before it finished aborts the request in the
engine. Outputs are the engine's own RequestOutput, rebuilt from the wire; their logprobs
entries are cadence.engine.wire.TokenLogprob (a SampledToken that carries the token texts).
Nothing here imports torch: the front end stays a thin asyncio process. `in_process=True`
runs the same engine loop in a thread of this process (inproc sockets) - for measuring what
the process split buys.
"""

from __future__ import annotations

import dataclasses

import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import zmq
import zmq.asyncio

from cadence.engine.engine_process import EngineProcessConfig, serve_engine
from cadence.engine.outputs import RequestOutput
from cadence.engine.request_stream import RequestState, RequestStream
from cadence.engine.wire import (
    AbortRequests,
    AddRequest,
    EngineBatch,
    EngineFatal,
    EngineHeartbeat,
    EngineReady,
    GetStats,
    Shutdown,
    Tokenize,
    decode_message,
    encode_message,
    output_from_wire,
)


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    max_model_len: int
    vocab_size: int
    pid: int
    max_token_chars: int | None = None
    generation_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer_info: dict[str, Any] = dataclasses.field(default_factory=dict)


class EngineRejected(Exception):
    """The engine refused a request on admission (status is the HTTP status to answer)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class EngineDeadError(RuntimeError):
    """The engine process exited or failed; requests in flight cannot complete."""


class EngineMetricsSink(Protocol):
    """Where engine telemetry goes (cadence.telemetry.prometheus.PrometheusMetrics)."""

    def record_request(self, record: Mapping[str, Any]) -> None: ...
    def record_iteration(self, num_steps: int, num_prefill_tokens: int,
                         num_decode_tokens: int) -> None: ...
    def record_generated_tokens(self, num_tokens: int) -> None: ...
    def update_engine_stats(self, stats: Mapping[str, Any]) -> None: ...


class AsyncEngineClient:
    """Talks to one engine core over ZeroMQ. Build it with `await AsyncEngineClient.start(...)`."""

    def __init__(self, context: zmq.asyncio.Context, in_socket: Any, out_socket: Any,
                 metrics: EngineMetricsSink | None) -> None:
        self._context = context
        self._in = in_socket  # we PUSH requests
        self._out = out_socket  # we PULL batches
        self._metrics = metrics
        self._requests: dict[str, RequestState] = {}
        self._stats_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tokenize_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._nonces = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._ipc_dir: str | None = None
        self.info: EngineInfo | None = None
        self.last_stats: dict[str, Any] = {}
        self.dead_reason: str | None = None
        self._closing = False
        # Set once the reader stopped (engine died, failed or shut down): the supervisor waits
        # on it to respawn the engine.
        self._stopped = asyncio.Event()

    # ---- lifecycle

    @classmethod
    async def start(cls, cfg: EngineProcessConfig, *, in_process: bool = False,
                    metrics: EngineMetricsSink | None = None,
                    startup_timeout_s: float = 900.0) -> AsyncEngineClient:
        """Start the engine core (a child process, or a thread with `in_process`), wait ready."""
        context = zmq.asyncio.Context()
        in_socket = context.socket(zmq.PUSH)
        out_socket = context.socket(zmq.PULL)
        in_socket.setsockopt(zmq.LINGER, 0)
        out_socket.setsockopt(zmq.LINGER, 0)
        client = cls(context, in_socket, out_socket, metrics)
        if in_process:
            tag = f"{os.getpid()}-{id(client)}"
            in_addr, out_addr = f"inproc://cadence-in-{tag}", f"inproc://cadence-out-{tag}"
        else:
            client._ipc_dir = tempfile.mkdtemp(prefix="cadence-engine-")
            in_addr = f"ipc://{client._ipc_dir}/in"
            out_addr = f"ipc://{client._ipc_dir}/out"
        in_socket.bind(in_addr)
        out_socket.bind(out_addr)
        if in_process:
            # The thread's sockets live on the same context (inproc needs it); sync API, so a
            # plain zmq.Context shadowing the asyncio one.
            sync_context = zmq.Context.shadow(context.underlying)
            client._thread = threading.Thread(
                target=serve_engine, args=(cfg, sync_context, in_addr, out_addr),
                name="cadence-engine", daemon=True)
            client._thread.start()
        else:
            client._process = _spawn_engine_process(cfg, in_addr, out_addr)
        try:
            await client._wait_ready(startup_timeout_s)
        except BaseException:
            await client._teardown(kill=True)
            raise
        client._reader = asyncio.create_task(client._read_loop(), name="cadence-engine-reader")
        return client

    def _engine_alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self._thread is not None and self._thread.is_alive()

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if await self._out.poll(200):
                msg = decode_message(await self._out.recv())
                if isinstance(msg, EngineReady):
                    self.info = EngineInfo(msg.model_name, msg.max_model_len, msg.vocab_size,
                                           msg.pid, msg.max_token_chars,
                                           msg.generation_defaults, msg.summary,
                                           msg.tokenizer_info)
                    self._apply_stats(msg.stats)
                    return
                if isinstance(msg, EngineFatal):
                    raise EngineDeadError(f"engine failed to start: {msg.message}")
                continue
            if not self._engine_alive():
                code = self._process.returncode if self._process is not None else None
                raise EngineDeadError(f"engine exited during startup (exit code {code})")
            if time.monotonic() > deadline:
                raise EngineDeadError(f"engine not ready after {timeout_s:.0f}s")

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is live (streams end with finish_reason "abort"), stop the engine."""
        if self._closing:
            return
        self._closing = True
        if self.dead_reason is None and self._engine_alive():
            await self._in.send(encode_message(Shutdown()))
            deadline = time.monotonic() + timeout_s
            while self._engine_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            # Give the reader a moment to route the final batch (the abort outputs).
            await asyncio.sleep(0.05)
        await self._teardown(kill=self._engine_alive())

    async def _teardown(self, kill: bool) -> None:
        if self._process is not None and kill:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_everything(EngineDeadError(self.dead_reason or "engine shut down"))
        self._stopped.set()
        self._in.close()
        self._out.close()
        if self._thread is not None and self._thread.is_alive():
            # An engine thread that did not stop still owns sockets on this context; term()
            # would wait for it forever. Leave it to die with the (daemon) thread.
            return
        self._context.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def attach_metrics(self, metrics: EngineMetricsSink) -> None:
        """Send engine telemetry to `metrics` from now on (starting with the latest stats)."""
        self._metrics = metrics
        if self.last_stats:
            metrics.update_engine_stats(self.last_stats)

    async def wait_stopped(self) -> None:
        """Return once this client can serve no more (engine dead, failed or shut down)."""
        await self._stopped.wait()

    @property
    def is_closing(self) -> bool:
        return self._closing

    @property
    def is_healthy(self) -> bool:
        return self.dead_reason is None and not self._closing and self._engine_alive()

    # ---- requests

    async def submit(
        self,
        req_id: str,
        *,
        sampling: Mapping[str, Any],
        prompt_text: str | None = None,
        prompt_token_ids: list[int] | None = None,
        chat_messages: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        priority: int = 0,
        arrival_time: float | None = None,
        want_prompt_text: bool = False,
        want_prompt_token_ids: bool = False,
        add_special_tokens: bool | None = None,
        cache_salt: str | None = None,
        truncation_side: str | None = None,
        kv_transfer_params: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestStream:
        """Send one request and wait until the engine admits it (EngineRejected if not)."""
        if not self.is_healthy:
            raise EngineDeadError(self.dead_reason or "engine is shutting down")
        if req_id in self._requests:
            raise EngineRejected(400, f"duplicate request id {req_id!r}")
        state = RequestState()
        self._requests[req_id] = state
        msg = AddRequest(req_id=req_id, sampling=dict(sampling), prompt_text=prompt_text,
                         prompt_token_ids=prompt_token_ids, chat_messages=chat_messages,
                         add_generation_prompt=add_generation_prompt, priority=priority,
                         arrival_time=time.monotonic() if arrival_time is None else arrival_time,
                         want_prompt_text=want_prompt_text,
                         want_prompt_token_ids=want_prompt_token_ids,
                         add_special_tokens=add_special_tokens, cache_salt=cache_salt,
                         truncation_side=truncation_side,
                         kv_transfer_params=None if kv_transfer_params is None
                         else dict(kv_transfer_params), chat_template=chat_template,
                         continue_final_message=continue_final_message,
                         chat_template_kwargs=None if chat_template_kwargs is None
                         else dict(chat_template_kwargs))
        try:
            await self._in.send(encode_message(msg))
            accepted = await state.accepted
        except BaseException as exc:
            self._requests.pop(req_id, None)
            if isinstance(exc, asyncio.CancelledError):
                # The client left while we waited for admission: the engine may admit it later.
                self.abort_nowait([req_id])
            raise
        return RequestStream(req_id, accepted, state,
                             on_close=lambda abort: self._close_stream(req_id, abort))

    async def generate(self, req_id: str, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        """submit() then iterate: the outputs of one request (raises EngineRejected first)."""
        stream = await self.submit(req_id, **kwargs)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort_nowait(self, req_ids: list[str]) -> None:
        """Abort requests without awaiting (safe from finally blocks of cancelled tasks)."""
        for req_id in req_ids:
            self._requests.pop(req_id, None)
        if req_ids and self.dead_reason is None and not self._in.closed:
            self._in.send(encode_message(AbortRequests(req_ids=list(req_ids))))

    async def abort(self, req_ids: list[str]) -> None:
        self.abort_nowait(req_ids)

    async def abort_all(self, reason: str = "abort") -> None:
        """Abort every live request; their streams end with finish_reason "abort"."""
        if self.dead_reason is None and not self._in.closed:
            await self._in.send(encode_message(AbortRequests(reason=reason, all_requests=True)))

    async def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """A fresh scheduler stats snapshot from the engine (last known one on timeout)."""
        if not self.is_healthy:
            return dict(self.last_stats)
        nonce = next(self._nonces)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._stats_waiters[nonce] = future
        await self._in.send(encode_message(GetStats(nonce)))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return dict(self.last_stats)
        finally:
            self._stats_waiters.pop(nonce, None)

    @property
    def num_live_requests(self) -> int:
        return len(self._requests)

    def _close_stream(self, req_id: str, abort: bool) -> None:
        if abort:
            self.abort_nowait([req_id])
        self._requests.pop(req_id, None)

    # ---- the reader

    async def _read_loop(self) -> None:
        try:
            while True:
                if not await self._out.poll(1000):
                    if not self._engine_alive():
                        if not self._closing:
                            self.dead_reason = "engine process exited unexpectedly"
                        break
                    continue
                msg = decode_message(await self._out.recv())
                if isinstance(msg, EngineBatch):
                    self._route(msg)
                elif isinstance(msg, EngineHeartbeat):
                    self._apply_stats(msg.stats)
                elif isinstance(msg, EngineFatal):
                    self.dead_reason = f"engine failed: {msg.message}"
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave streams hanging
            self.dead_reason = f"engine client reader failed: {type(exc).__name__}: {exc}"
        self._fail_everything(EngineDeadError(self.dead_reason or "engine stopped"))
        self._stopped.set()

    def _fail_everything(self, exc: BaseException) -> None:
        for state in self._requests.values():
            if not state.accepted.done():
                state.accepted.set_exception(exc)
            else:
                state.queue.put_nowait(exc)
        self._requests.clear()
        for future in self._stats_waiters.values():
            if not future.done():
                future.set_result(dict(self.last_stats))
        for future in self._tokenize_waiters.values():
            if not future.done():
                future.set_exception(exc)

    async def tokenize(self, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
        """Tokenize / detokenize in the engine (fields of wire.Tokenize but the nonce):
        {"tokens": [...]} or {"text": ...}; EngineRejected(400) on bad input."""
        if not self.is_healthy:
            raise EngineDeadError(self.dead_reason or "engine is shutting down")
        nonce = next(self._nonces)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._tokenize_waiters[nonce] = future
        try:
            await self._in.send(encode_message(Tokenize(nonce, **fields)))
            reply = await asyncio.wait_for(future, timeout_s)
        finally:
            self._tokenize_waiters.pop(nonce, None)
        if "error" in reply:
            raise EngineRejected(reply.get("status", 400), reply["error"], reply.get("param"),
                                 reply.get("code") or "invalid_value")
        return reply

    def _apply_stats(self, stats: Mapping[str, Any] | None) -> None:
        if stats:
            self.last_stats = dict(stats)
            if self._metrics is not None:
                self._metrics.update_engine_stats(stats)

    def _route(self, batch: EngineBatch) -> None:
        for acc in batch.accepted:
            state = self._requests.get(acc["req_id"])
            if state is not None and not state.accepted.done():
                state.accepted.set_result(acc)
        for rej in batch.rejected:
            state = self._requests.pop(rej["req_id"], None)
            if state is not None and not state.accepted.done():
                state.accepted.set_exception(EngineRejected(
                    rej["status"], rej["message"], rej.get("param"), rej.get("code")))
        generated = 0
        for wire in batch.outputs:
            generated += len(wire["token_ids"])
            state = self._requests.get(wire["req_id"])
            if state is None:
                continue  # aborted by us: the client is gone
            out = output_from_wire(wire)
            state.queue.put_nowait(out)
            if out.finished:
                self._requests.pop(out.req_id, None)
        self._apply_stats(batch.stats)
        for reply in batch.tokenize_replies:
            future = self._tokenize_waiters.get(reply.get("nonce"))
            if future is not None and not future.done():
                future.set_result(reply)
        for nonce in batch.stats_replies:
            future = self._stats_waiters.get(nonce)
            if future is not None and not future.done():
                future.set_result(dict(batch.stats or self.last_stats))
        if self._metrics is not None:
            for record in batch.finished:
                self._metrics.record_request(record)
            if batch.iteration is not None:
                self._metrics.record_iteration(*batch.iteration)
            record_steps = getattr(self._metrics, "record_steps", None)
            if batch.steps and record_steps is not None:
                record_steps(batch.steps)
            if generated:
                self._metrics.record_generated_tokens(generated)


def _spawn_engine_process(cfg: EngineProcessConfig, in_addr: str,
                          out_addr: str) -> subprocess.Popen[bytes]:
    """A fresh interpreter (no fork of an asyncio process), config as JSON on stdin."""
    env = dict(os.environ)
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # idle OpenMP threads must not spin on shared cores
    if cfg.engine_threads is not None:
        env["OMP_NUM_THREADS"] = str(cfg.engine_threads)
    # The engine process imports what this one can (tests pass a fake engine factory).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cadence.engine.engine_process", in_addr, out_addr],
        stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(cfg.to_json().encode("utf-8"))
    proc.stdin.close()
    return proc
