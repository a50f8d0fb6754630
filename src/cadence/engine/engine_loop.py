"""EngineCoreLoop: the engine process's main loop, between two sockets and one EngineCore.

The loop blocks on the input socket while the engine is idle (no spinning) and, when busy,
drains every pending message between two steps, so a burst of arrivals or disconnects is
handled in one turn. Each turn sends at most one EngineBatch (cadence.engine.wire): admissions,
rejections, outputs, finished-request telemetry and fresh scheduler stats. The engine
detokenizes incrementally (RequestOutput.new_text), stop strings included.

Per-request work that grows with the input (tokenization, the chat template, grammar
compilation: `admission.prepare`; /tokenize and /detokenize: `admission.answer_tokenize`) runs
in a small pool of admission threads, never between two steps: a long prompt cannot stall the
running streams (the `tokenizers` library releases the GIL while it encodes a long text, the
chat template renders in worker processes). Several threads, so one slow request cannot hold
everyone else's admission; each piece of work is bounded in size before it starts and has a
deadline (ADMISSION_DEADLINE_S) after which its client gets an answer and its result, if it
ever comes, is dropped. A prepared request joins the engine at the next turn (prepared
requests in arrival order); the queue limits are checked then.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from cadence.engine.admission import (
    AdmissionError,
    AdmissionLimits,
    AdmittedRequest,
    answer_tokenize,
    check_queue_limits,
    prepare,
)
from cadence.engine.engine_core import EngineCore
from cadence.engine.outputs import RequestOutput
from cadence.engine.wire import (
    AbortRequests,
    AddRequest,
    EngineBatch,
    GetStats,
    Shutdown,
    Tokenize,
    WireError,
    decode_message,
    encode_message,
    output_to_wire,
)


@dataclass
class _LiveRequest:
    """What the loop itself tracks per admitted request (timing lives in engine telemetry)."""

    req_id: str
    num_prompt_tokens: int
    num_output_tokens: int = 0

    @property
    def queued(self) -> bool:
        # "Queued" for admission limits = admitted, first token not yet produced.
        return self.num_output_tokens == 0


class EngineCoreLoop:
    """Runs `engine` against a pair of sockets until shutdown (see the module docstring)."""

    # Idle wake-up period to notice a dead parent; not a spin: the poll blocks until then.
    IDLE_POLL_MS = 1000
    # While idle with requests being tokenized: how long one turn waits for the tokenizer.
    PREPARE_WAIT_S = 0.005
    # Admission threads: requests prepared at once (a slow one holds only its own thread;
    # threads start on demand). Grammar compiles and template renders can each take seconds.
    ADMISSION_THREADS = 16
    # Seconds a request's preparation (or a /tokenize call) may take before its client is
    # answered 503; the bounded sizes and the template's own budget keep real work far below.
    ADMISSION_DEADLINE_S = 20.0

    def __init__(self, engine: EngineCore, in_socket: Any, out_socket: Any,
                 limits: AdmissionLimits, parent_pid: int | None = None) -> None:
        self.engine = engine
        self.in_socket = in_socket
        self.out_socket = out_socket
        self.limits = limits
        self.parent_pid = parent_pid
        self._live: dict[str, _LiveRequest] = {}
        # Requests being tokenized, in arrival order: req_id -> (message, prepare() future,
        # deadline).
        self._preparing: dict[str, tuple[AddRequest, Future[AdmittedRequest], float]] = {}
        # /tokenize and /detokenize calls in the admission threads: nonce -> (future, deadline).
        self._tokenizing: dict[int, tuple[Future[dict[str, Any]], float]] = {}
        self._admission = ThreadPoolExecutor(max_workers=self.ADMISSION_THREADS,
                                             thread_name_prefix="cadence-admission")
        self._running = True
        # The batch this turn sends; during a long step a short prompt can be admitted and
        # run inside it (interjection): the loop then sends what it has at once.
        self._batch = EngineBatch()
        # Messages received during a step that must wait for its end (aborts free blocks
        # the step may still be writing; shutdown stops the loop).
        self._deferred: list[Any] = []
        hooks = getattr(engine, "set_interjection_hooks", None)
        if hooks is not None:
            hooks(self._poll_during_step, self._emit_during_step)

    # ---- admission

    def _queued_counts(self) -> tuple[int, int]:
        queued = [r for r in self._live.values() if r.queued]
        return len(queued), sum(r.num_prompt_tokens for r in queued)

    def _start_admission(self, msg: AddRequest, batch: EngineBatch) -> None:
        if msg.req_id in self._live or msg.req_id in self._preparing:
            batch.rejected.append(AdmissionError(
                400, f"duplicate request id {msg.req_id!r}", param="id").to_wire(msg.req_id))
            return
        self._preparing[msg.req_id] = (msg, self._admission.submit(prepare, self.engine, msg),
                                       time.monotonic() + self.ADMISSION_DEADLINE_S)

    def _admit_prepared(self, batch: EngineBatch) -> None:
        """Add the requests whose preparation finished (in arrival order among them); refuse
        those past their deadline."""
        now = time.monotonic()
        for req_id, (msg, future, deadline) in list(self._preparing.items()):
            if not future.done():
                if now > deadline:
                    del self._preparing[req_id]  # its result is dropped when it arrives
                    batch.rejected.append(_deadline_error().to_wire(req_id))
                continue
            del self._preparing[req_id]
            try:
                self._admit(msg, future.result(), batch)
            except AdmissionError as exc:
                batch.rejected.append(exc.to_wire(req_id))
            except Exception as exc:  # tokenizer or engine bug: refuse this request, keep going
                traceback.print_exception(exc)
                batch.rejected.append(AdmissionError(
                    500, f"engine failed to admit the request: {type(exc).__name__}: {exc}"
                ).to_wire(req_id))

    def _admit(self, msg: AddRequest, admitted: AdmittedRequest, batch: EngineBatch) -> None:
        ids = admitted.prompt_token_ids
        check_queue_limits(self.limits, *self._queued_counts(), len(ids))
        # Only disaggregation-aware engines (cadence.disagg) take the extra argument; any other
        # engine refuses it (a 400 naming the field) rather than fail on the call.
        extra = {"kv_transfer_params": msg.kv_transfer_params} if msg.kv_transfer_params else {}
        if extra and not _accepts(self.engine.add_request, "kv_transfer_params"):
            raise AdmissionError(400, "kv_transfer_params needs a disaggregated worker "
                                 "(cadence serve --role prefill|decode, or --disagg)",
                                 param="kv_transfer_params", code="unsupported_parameter")
        if msg.cache_salt is not None:
            if not _accepts(self.engine.add_request, "cache_salt"):
                raise AdmissionError(400, "this engine has no prefix cache to salt",
                                     param="cache_salt", code="unsupported_parameter")
            extra["cache_salt"] = msg.cache_salt
        try:
            self.engine.add_request(msg.req_id, ids, admitted.params, msg.priority,
                                    msg.arrival_time, **extra)
        except ValueError as exc:  # the engine's own input checks
            code = getattr(exc, "code", None)
            raise AdmissionError(400, str(exc), param=None if code else admitted.prompt_param,
                                 code=code) from exc
        self._live[msg.req_id] = _LiveRequest(msg.req_id, len(ids))
        prompt_text = None
        if msg.want_prompt_text:
            prompt_text = msg.prompt_text
            if prompt_text is None or msg.sampling.get("truncate_prompt_tokens") is not None:
                # The prompt as run: given as ids, or cut by truncate_prompt_tokens (echo shows
                # the tokens the reply continues, as vLLM's).
                prompt_text = "".join(self.engine.token_text(t) for t in ids)
        record = {"req_id": msg.req_id, "num_prompt_tokens": len(ids), "prompt_text": prompt_text}
        if msg.want_prompt_token_ids:
            record["prompt_token_ids"] = [int(t) for t in ids]
        batch.accepted.append(record)

    # ---- aborts and failures

    def _finish_live(self, req_id: str, reason: str, batch: EngineBatch,
                     error: str | None = None, notify: bool = True) -> None:
        live = self._live.pop(req_id, None)
        if live is None or not notify:
            return
        final = RequestOutput(req_id=req_id, new_token_ids=(), new_text="", finished=True,
                              finish_reason=reason, num_prompt_tokens=live.num_prompt_tokens,
                              num_output_tokens=live.num_output_tokens, num_cached_tokens=0,
                              error=error)
        batch.outputs.append(output_to_wire(final, self.engine.token_text))

    def _abort(self, msg: AbortRequests, batch: EngineBatch) -> None:
        ids = list(self._live) if msg.all_requests else msg.req_ids
        if msg.all_requests and ids:
            print(f"[cadence engine] aborting {len(ids)} live requests: {msg.reason}",
                  file=sys.stderr)
        for req_id in list(self._preparing) if msg.all_requests else ids:
            if req_id in self._preparing:
                del self._preparing[req_id]  # its result is dropped when it arrives
                if msg.all_requests:
                    batch.rejected.append(AdmissionError(
                        503, f"the request was aborted before it started ({msg.reason})",
                        code="request_aborted").to_wire(req_id))
        for req_id in ids:
            if req_id in self._live:
                self.engine.abort_request(req_id)
                # The client of a plain abort is gone; server-side aborts (all_requests) are
                # told, so their streams end with an explicit finish_reason.
                self._finish_live(req_id, "abort", batch, notify=msg.all_requests)

    # ---- one loop turn

    def _receive(self, block: bool) -> list[Any]:
        import zmq

        msgs = []
        # An engine with work outside the step (KV transfers of cadence.disagg) may add a
        # socket that wakes the loop, and a shorter idle wait (its next deadline).
        wakeup = getattr(self.engine, "wakeup_socket", None)
        if block:
            poller = zmq.Poller()
            poller.register(self.in_socket, zmq.POLLIN)
            if wakeup is not None:
                poller.register(wakeup, zmq.POLLIN)
            while True:
                timeout = self.IDLE_POLL_MS
                idle_timeout = getattr(self.engine, "idle_timeout_ms", None)
                if idle_timeout is not None:
                    timeout = min(timeout, max(1, int(idle_timeout())))
                events = dict(poller.poll(timeout))
                if self.in_socket in events or wakeup in events:
                    break
                if self._parent_gone():
                    return [Shutdown(reason="parent exited")]
                if idle_timeout is not None:
                    break  # a deadline of the engine's is due
            if wakeup is not None:
                _drain(wakeup)
        elif self._parent_gone():
            # Busy: without this check an orphan would step (and fill its send queue) forever.
            return [Shutdown(reason="parent exited")]
        while True:
            try:
                data = self.in_socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            try:
                msgs.append(decode_message(data))
            except WireError as exc:
                print(f"[cadence engine] dropping {exc}", file=sys.stderr)

    def _parent_gone(self) -> bool:
        # Reparenting changes getppid(); a cheap syscall, fine once per turn.
        if self.parent_pid is None or os.getppid() == self.parent_pid:
            return False
        import zmq

        self.out_socket.setsockopt(zmq.LINGER, 0)  # nobody will read the final batch
        return True

    def _handle(self, msg: Any, batch: EngineBatch) -> None:
        if isinstance(msg, AddRequest):
            self._start_admission(msg, batch)
        elif isinstance(msg, AbortRequests):
            self._abort(msg, batch)
        elif isinstance(msg, GetStats):
            batch.stats_replies.append(msg.nonce)
        elif isinstance(msg, Tokenize):
            self._tokenizing[msg.nonce] = (self._admission.submit(self._tokenize, msg),
                                           time.monotonic() + self.ADMISSION_DEADLINE_S)
        elif isinstance(msg, Shutdown):
            self._abort(AbortRequests(reason=msg.reason, all_requests=True), batch)
            self._running = False

    def _tokenize(self, msg: Tokenize) -> dict[str, Any]:
        """/tokenize and /detokenize, answered by the process that owns the tokenizer (in an
        admission thread)."""
        try:
            return {"nonce": msg.nonce, **answer_tokenize(self.engine, msg)}
        except AdmissionError as exc:  # bad ids, template errors: the client's fault
            return _tokenize_error(msg.nonce, exc)

    def _answer_tokenized(self, batch: EngineBatch) -> None:
        """The replies of finished /tokenize calls; a 503 for those past their deadline."""
        now = time.monotonic()
        for nonce, (future, deadline) in list(self._tokenizing.items()):
            if future.done():
                del self._tokenizing[nonce]
                try:
                    batch.tokenize_replies.append(future.result())
                except Exception as exc:  # a tokenizer bug: this call fails, the loop goes on
                    traceback.print_exception(exc)
                    batch.tokenize_replies.append(_tokenize_error(nonce, AdmissionError(
                        500, f"tokenizing failed: {type(exc).__name__}", code="engine_error")))
            elif now > deadline:
                del self._tokenizing[nonce]
                batch.tokenize_replies.append(_tokenize_error(nonce, _deadline_error()))

    def _pending_admission(self) -> list[Future]:
        return ([entry[1] for entry in self._preparing.values()]
                + [entry[0] for entry in self._tokenizing.values()])

    def _record_step(self, outputs: Sequence[Any], batch: EngineBatch) -> None:
        for out in outputs:
            live = self._live.get(out.req_id)
            if live is None:
                continue  # aborted meanwhile: its client was already told (or is gone)
            wire = output_to_wire(out, self.engine.token_text)
            live.num_output_tokens = wire["num_output_tokens"]
            batch.outputs.append(wire)
            if wire["finished"]:
                del self._live[out.req_id]

    def _fail_all(self, exc: BaseException, batch: EngineBatch) -> None:
        """The step raised: end every live request with finish_reason "error", keep serving."""
        traceback.print_exc()
        message = f"engine step failed: {type(exc).__name__}: {exc}"
        for req_id in list(self._live):
            try:
                self.engine.abort_request(req_id)
            except Exception:
                traceback.print_exc()
            self._finish_live(req_id, "error", batch, error=message)

    # ---- during a step (interjection hooks, LLMEngine.set_interjection_hooks)

    def _poll_during_step(self) -> None:
        """Between two layers of a long step: take new requests in (tokenizing, admitting the
        tokenized), answer stats and tokenize calls; aborts and shutdown wait for the step."""
        for msg in self._receive(block=False):
            if isinstance(msg, (AddRequest, GetStats, Tokenize)):
                self._handle(msg, self._batch)
            else:
                self._deferred.append(msg)
        if self._running:
            self._admit_prepared(self._batch)
        self._answer_tokenized(self._batch)
        if self._batch.tokenize_replies:
            # A router may be waiting on it to route a request: answer now, not at the
            # step's end.
            self._send_batch_now()

    def _emit_during_step(self, outputs: Sequence[Any]) -> None:
        """A short prompt ran inside the step: send its first token (and the admissions
        before it) now, not when the step ends."""
        self._record_step(outputs, self._batch)
        self._send_batch_now()

    def _send_batch_now(self) -> None:
        """Send what the current step's batch holds so far (mid-step) and start a new one."""
        batch = self._batch
        if not batch.is_empty():
            batch.stats = self.engine.stats()
            self.out_socket.send(encode_message(batch))
        self._batch = EngineBatch()

    def run_once(self) -> bool:
        """One turn: messages, then at most one step, then one batch out. False once stopped."""
        self._batch = batch = EngineBatch()
        service = getattr(self.engine, "service", None)
        if service is not None:
            service()  # finished transfers, acknowledgements, expired leases
        busy = self.engine.has_unfinished()
        waiting_only = getattr(self.engine, "waits_only_on_transfers", None)
        if busy and waiting_only is not None and waiting_only():
            busy = False  # nothing to step until a transfer ends: block on the sockets
        deferred, self._deferred = self._deferred, []
        pending = self._pending_admission()
        block = not busy and not pending and not deferred
        for msg in deferred + self._receive(block=block):
            self._handle(msg, batch)
        pending = self._pending_admission()
        if pending and not self.engine.has_unfinished():
            # Idle but tokenizing: wait for the tokenizer a little instead of spinning.
            wait_futures(pending, timeout=self.PREPARE_WAIT_S, return_when=FIRST_COMPLETED)
        if self._running:
            self._admit_prepared(batch)
        self._answer_tokenized(batch)
        if self._running and self.engine.has_unfinished():
            try:
                outputs = self.engine.step()
            except Exception as exc:
                batch = self._batch  # a batch sent during the step was replaced
                self._fail_all(exc, batch)
            else:
                batch = self._batch
                self._record_step(outputs, batch)
        telemetry = self.engine.take_telemetry()
        batch.finished.extend(telemetry.finished)
        batch.steps.extend(telemetry.steps)
        if telemetry.num_steps:
            batch.iteration = [telemetry.num_steps, telemetry.num_prefill_tokens,
                               telemetry.num_decode_tokens]
        if not batch.is_empty():
            batch.stats = self.engine.stats()
            self.out_socket.send(encode_message(batch))
        return self._running

    def run(self) -> None:
        try:
            while self.run_once():
                pass
        finally:
            self._admission.shutdown(wait=False, cancel_futures=True)


def _deadline_error() -> AdmissionError:
    return AdmissionError(503, f"preparing the request took longer than "
                          f"{EngineCoreLoop.ADMISSION_DEADLINE_S:.0f}s; retry later.",
                          code="admission_timeout")


def _tokenize_error(nonce: int, exc: AdmissionError) -> dict[str, Any]:
    return {"nonce": nonce, "error": exc.message, "status": exc.status, "param": exc.param,
            "code": exc.code}


def _drain(socket: Any) -> None:
    import zmq

    while True:
        try:
            socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return


def _accepts(func: Any, name: str) -> bool:
    """Whether `func` takes keyword argument `name` (or **kwargs)."""
    import inspect

    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
