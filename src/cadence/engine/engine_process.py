"""The engine core in its own process: the LLMEngine step loop behind two ZeroMQ sockets.

Why a process: the HTTP front end (JSON, SSE, asyncio) and the step loop (torch) would share one
GIL; in separate processes the front end cannot steal engine time between steps.

Wire protocol (JSON objects with a "type" tag, never pickled objects), over PUSH/PULL pairs that
the front end binds and this process connects to:

    front end -> engine   add | abort | stats | shutdown
    engine -> front end   ready (once, after loading) | batch (once per loop turn) | fatal

The loop blocks on the input socket while the engine is idle (no spinning) and, when busy,
drains every pending message between two steps, so a burst of arrivals or disconnects is
handled in one turn. Tokenization (and the chat template) happen here, on admission: one owner of
the tokenizer, and prompt-length errors come back before the client's stream starts. The engine
detokenizes incrementally (RequestOutput.new_text), stop strings included.

Telemetry: the engine's own recorder (cadence.telemetry) times every request on the monotonic
clock, arrival stamped by the front end when the HTTP request came in (CLOCK_MONOTONIC is
system-wide on one host). A listener here buffers finished timelines and step token counts and
ships them inside each batch with the scheduler stats; the front end feeds them into its
Prometheus registry. The front end never computes engine metrics itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from cadence.core.sampling_params import SamplingParams

# ---- wire messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    """Admit one request. Exactly one of prompt_text / prompt_token_ids / chat_messages is set.

    `sampling` holds SamplingParams fields; its max_tokens may be None: the rest of the context.
    """

    req_id: str
    sampling: dict[str, Any]
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    chat_messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    priority: int = 0
    # time.monotonic() of the front end when the HTTP request arrived: CLOCK_MONOTONIC is
    # system-wide, so the engine's timelines (same clock) include the front end's share.
    arrival_time: float | None = None
    want_prompt_text: bool = False


@dataclass(frozen=True)
class AbortRequests:
    """Abort requests (client gone, shutdown). With `all_requests`, every live one."""

    req_ids: list[str] = field(default_factory=list)
    # Why, for the engine's log; clients always see finish_reason "abort".
    reason: str = "abort"
    all_requests: bool = False


@dataclass(frozen=True)
class GetStats:
    """Ask for a fresh stats snapshot; answered in the next batch's `stats_replies`."""

    nonce: int


@dataclass(frozen=True)
class Shutdown:
    """Abort everything still live (finish_reason "abort"), send the final batch, exit."""

    reason: str = "shutdown"  # for the engine's log


@dataclass(frozen=True)
class EngineReady:
    model_name: str
    max_model_len: int
    vocab_size: int
    pid: int
    stats: dict[str, Any]


@dataclass
class EngineBatch:
    """Everything one loop turn produced (filled in during the turn, hence not frozen).

    accepted: [{req_id, num_prompt_tokens, prompt_text}]; rejected: [{req_id, status, message,
    param, code}]; outputs: wire outputs (see `output_to_wire`); finished: finished-request
    telemetry records (see `timeline_record`); iteration: [num_steps, num_prefill_tokens,
    num_decode_tokens] of the steps run; stats: scheduler stats after this turn.
    """

    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    iteration: list[int] | None = None
    stats: dict[str, Any] | None = None
    stats_replies: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.accepted or self.rejected or self.outputs or self.finished
                    or self.stats_replies or self.iteration)


@dataclass(frozen=True)
class EngineFatal:
    message: str


_MESSAGE_TYPES: Mapping[str, type] = MappingProxyType({
    "add": AddRequest,
    "abort": AbortRequests,
    "stats": GetStats,
    "shutdown": Shutdown,
    "ready": EngineReady,
    "batch": EngineBatch,
    "fatal": EngineFatal,
})
_TYPE_NAMES: Mapping[type, str] = MappingProxyType({v: k for k, v in _MESSAGE_TYPES.items()})


class WireError(ValueError):
    """A message that is not valid JSON or not one of the known message types."""


def encode_message(msg: Any) -> bytes:
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    body["type"] = _TYPE_NAMES[type(msg)]
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_message(data: bytes) -> Any:
    try:
        body = json.loads(data)
        cls = _MESSAGE_TYPES[body.pop("type")]
        return cls(**body)
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"bad engine message: {exc}") from exc


_TUPLE_FIELDS = tuple(
    f.name for f in dataclasses.fields(SamplingParams) if str(f.type).startswith("tuple")
)


def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams as JSON-native data (tuples become lists)."""
    wire = {f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in wire.items()}


def sampling_from_wire(data: Mapping[str, Any]) -> SamplingParams:
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown sampling fields: {sorted(unknown)}")
    kwargs = {k: (tuple(v) if k in _TUPLE_FIELDS and v is not None else v) for k, v in data.items()}
    return SamplingParams(**kwargs)


# ---- the engine core seen by the loop --------------------------------------------------------


class EngineCore(Protocol):
    """What the loop needs from an engine (LLMEngineAdapter wraps the real LLMEngine)."""

    model_name: str
    max_model_len: int
    vocab_size: int

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def default_eos_token_ids(self) -> tuple[int, ...]: ...
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None) -> None: ...
    def abort_request(self, req_id: str) -> None: ...
    def step(self) -> Sequence[Any]: ...  # RequestOutput-like objects
    def has_unfinished(self) -> bool: ...
    def take_telemetry(self) -> TelemetryDelta: ...
    def stats(self) -> dict[str, Any]: ...


def logprobs_to_wire(logprobs: Any, token_ids: Sequence[int],
                     token_text: Callable[[int], str]) -> list[list[Any]] | None:
    """Per new token: [token_text, token_id, logprob, [[alt_text, alt_id, alt_logprob], ...]].

    Accepts a sequence of SampledToken-like entries (token_id, logprob, top_logprobs) or of
    plain floats, one per new token.
    """
    if not logprobs:
        return None
    wire = []
    for i, entry in enumerate(logprobs):
        tid = getattr(entry, "token_id", token_ids[i] if i < len(token_ids) else -1)
        lp = entry if isinstance(entry, int | float) else getattr(entry, "logprob", None)
        top = getattr(entry, "top_logprobs", ()) or ()
        wire.append([token_text(tid), tid, None if lp is None else float(lp),
                     [[token_text(a), a, float(b)] for a, b in top]])
    return wire


def output_to_wire(out: Any, token_text: Callable[[int], str]) -> dict[str, Any]:
    """RequestOutput-like object -> wire dict (the fields of RequestOutput, plain types)."""
    token_ids = [int(t) for t in out.new_token_ids]
    return {
        "req_id": out.req_id,
        "token_ids": token_ids,
        "text": out.new_text or "",
        "finished": bool(out.finished),
        "finish_reason": out.finish_reason,
        "num_prompt_tokens": int(out.num_prompt_tokens),
        "num_output_tokens": int(out.num_output_tokens),
        "num_cached_tokens": int(getattr(out, "num_cached_tokens", 0) or 0),
        "logprobs": logprobs_to_wire(getattr(out, "logprobs", None), token_ids, token_text),
        # Why a request ended with "error" (e.g. it can never fit the KV pool): reaches the client.
        "error": getattr(out, "error", None),
    }


# ---- per-request bookkeeping -----------------------------------------------------------------


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


def timeline_record(timeline: Any) -> dict[str, Any]:
    """A finished cadence.telemetry RequestTimeline as a plain dict (engine-clock seconds)."""
    return {
        "req_id": timeline.req_id,
        "finish_reason": timeline.finish_reason or "abort",
        "num_prompt_tokens": int(timeline.num_prompt_tokens),
        "num_output_tokens": int(timeline.num_output_tokens),
        "num_cached_tokens": int(max(0, timeline.num_cached_tokens)),
        "num_preemptions": int(timeline.num_preemptions),
        "queue_time": timeline.queue_time,
        "prefill_time": timeline.prefill_time,
        "ttft": timeline.ttft,
        "e2e": timeline.e2e,
        "decode_time": timeline.decode_time,
        "tpot": timeline.tpot,
        "itl": list(timeline.itl),
    }


@dataclass
class TelemetryDelta:
    """Telemetry gathered since the last drain: finished-request records, step token counts."""

    finished: list[dict[str, Any]] = field(default_factory=list)
    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


@dataclass(frozen=True)
class AdmissionLimits:
    """Back-pressure: answer 429 past these many queued requests / queued prompt tokens."""

    max_num_queued_requests: int | None = None
    max_num_queued_tokens: int | None = None


class AdmissionError(Exception):
    """A request refused on admission, with the HTTP status the front end should answer."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def to_wire(self, req_id: str) -> dict[str, Any]:
        return {"req_id": req_id, "status": self.status, "message": self.message,
                "param": self.param, "code": self.code}


# ---- the loop ---------------------------------------------------------------------------------


class EngineCoreLoop:
    """Runs `engine` against a pair of sockets until shutdown (see the module docstring)."""

    # Idle wake-up period to notice a dead parent; not a spin: the poll blocks until then.
    IDLE_POLL_MS = 1000

    def __init__(self, engine: EngineCore, in_socket: Any, out_socket: Any,
                 limits: AdmissionLimits, parent_pid: int | None = None) -> None:
        self.engine = engine
        self.in_socket = in_socket
        self.out_socket = out_socket
        self.limits = limits
        self.parent_pid = parent_pid
        self._live: dict[str, _LiveRequest] = {}
        self._running = True

    # ---- admission

    def _queued_counts(self) -> tuple[int, int]:
        queued = [r for r in self._live.values() if r.queued]
        return len(queued), sum(r.num_prompt_tokens for r in queued)

    def _prompt_ids(self, msg: AddRequest) -> list[int]:
        if msg.prompt_token_ids is not None:
            ids = list(msg.prompt_token_ids)
            bad = [t for t in ids if not 0 <= t < self.engine.vocab_size]
            if bad:
                raise AdmissionError(
                    400, f"prompt token id {bad[0]} is outside the vocabulary "
                    f"[0, {self.engine.vocab_size})", param="prompt", code="invalid_token_id")
            return ids
        if msg.chat_messages is not None:
            try:
                text = self.engine.render_chat(msg.chat_messages, msg.add_generation_prompt)
            except Exception as exc:  # jinja errors, bad roles: the client's fault
                raise AdmissionError(400, f"chat template failed: {exc}", param="messages",
                                     code="invalid_messages") from exc
            # The template already wrote the special tokens.
            return self.engine.tokenize(text, add_special_tokens=False)
        return self.engine.tokenize(msg.prompt_text or "")

    def _admit(self, msg: AddRequest, batch: EngineBatch) -> None:
        if msg.req_id in self._live:
            raise AdmissionError(400, f"duplicate request id {msg.req_id!r}", param="id")
        ids = self._prompt_ids(msg)
        n = len(ids)
        param = "messages" if msg.chat_messages is not None else "prompt"
        ctx = self.engine.max_model_len
        if n == 0:
            raise AdmissionError(400, "the prompt is empty (0 tokens)", param=param,
                                 code="empty_prompt")
        if n >= ctx:
            raise AdmissionError(
                400, f"This model's maximum context length is {ctx} tokens. However, the prompt "
                f"has {n} tokens, which leaves no room for a completion.", param=param,
                code="context_length_exceeded")
        sampling = dict(msg.sampling)
        if sampling.get("max_tokens") is None:
            sampling["max_tokens"] = ctx - n
        elif n + sampling["max_tokens"] > ctx:
            raise AdmissionError(
                400, f"This model's maximum context length is {ctx} tokens. However, you "
                f"requested {n + sampling['max_tokens']} tokens ({n} in the prompt, "
                f"{sampling['max_tokens']} for the completion).", param="max_tokens",
                code="context_length_exceeded")
        if not sampling.get("eos_token_ids"):
            sampling["eos_token_ids"] = list(self.engine.default_eos_token_ids())
        try:
            params = sampling_from_wire(sampling)
        except (ValueError, TypeError) as exc:
            raise AdmissionError(400, str(exc), code="invalid_value") from exc
        num_queued, queued_tokens = self._queued_counts()
        max_req, max_tok = self.limits.max_num_queued_requests, self.limits.max_num_queued_tokens
        if max_req is not None and num_queued >= max_req:
            raise AdmissionError(429, f"server busy: {num_queued} requests already queued "
                                 f"(limit {max_req}); retry later", code="queue_full")
        if max_tok is not None and queued_tokens + n > max_tok:
            raise AdmissionError(429, f"server busy: {queued_tokens} prompt tokens already "
                                 f"queued, this request adds {n} (limit {max_tok}); retry later",
                                 code="queue_full")
        try:
            self.engine.add_request(msg.req_id, ids, params, msg.priority, msg.arrival_time)
        except ValueError as exc:  # the engine's own input checks
            raise AdmissionError(400, str(exc), param=param) from exc
        self._live[msg.req_id] = _LiveRequest(msg.req_id, n)
        prompt_text = msg.prompt_text
        if msg.want_prompt_text and prompt_text is None:
            prompt_text = "".join(self.engine.token_text(t) for t in ids)
        batch.accepted.append({"req_id": msg.req_id, "num_prompt_tokens": n,
                               "prompt_text": prompt_text if msg.want_prompt_text else None})

    # ---- aborts and failures

    def _finish_live(self, req_id: str, reason: str, batch: EngineBatch,
                     error: str | None = None, notify: bool = True) -> None:
        live = self._live.pop(req_id, None)
        if live is None:
            return
        if notify:
            batch.outputs.append({
                "req_id": req_id, "token_ids": [], "text": "", "finished": True,
                "finish_reason": reason, "num_prompt_tokens": live.num_prompt_tokens,
                "num_output_tokens": live.num_output_tokens, "num_cached_tokens": 0,
                "logprobs": None, "error": error,
            })

    def _abort(self, msg: AbortRequests, batch: EngineBatch) -> None:
        ids = list(self._live) if msg.all_requests else msg.req_ids
        if msg.all_requests and ids:
            print(f"[cadence engine] aborting {len(ids)} live requests: {msg.reason}",
                  file=sys.stderr)
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
        if block:
            while not self.in_socket.poll(self.IDLE_POLL_MS, zmq.POLLIN):
                if self._parent_gone():
                    return [Shutdown(reason="parent exited")]
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
            try:
                self._admit(msg, batch)
            except AdmissionError as exc:
                batch.rejected.append(exc.to_wire(msg.req_id))
            except Exception as exc:  # tokenizer or engine bug: refuse this request, keep going
                traceback.print_exc()
                batch.rejected.append(AdmissionError(
                    500, f"engine failed to admit the request: {type(exc).__name__}: {exc}"
                ).to_wire(msg.req_id))
        elif isinstance(msg, AbortRequests):
            self._abort(msg, batch)
        elif isinstance(msg, GetStats):
            batch.stats_replies.append(msg.nonce)
        elif isinstance(msg, Shutdown):
            self._abort(AbortRequests(reason=msg.reason, all_requests=True), batch)
            self._running = False

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

    def run_once(self) -> bool:
        """One turn: messages, then at most one step, then one batch out. False once stopped."""
        batch = EngineBatch()
        busy = self.engine.has_unfinished()
        for msg in self._receive(block=not busy):
            self._handle(msg, batch)
        if self._running and self.engine.has_unfinished():
            try:
                outputs = self.engine.step()
            except Exception as exc:
                self._fail_all(exc, batch)
            else:
                self._record_step(outputs, batch)
        telemetry = self.engine.take_telemetry()
        batch.finished.extend(telemetry.finished)
        if telemetry.num_steps:
            batch.iteration = [telemetry.num_steps, telemetry.num_prefill_tokens,
                               telemetry.num_decode_tokens]
        if not batch.is_empty():
            batch.stats = self.engine.stats()
            self.out_socket.send(encode_message(batch))
        return self._running

    def run(self) -> None:
        while self.run_once():
            pass


# ---- building the engine ----------------------------------------------------------------------


class _TelemetryCollector:
    """A cadence.telemetry listener that buffers what the front end's metrics need."""

    def __init__(self) -> None:
        self.delta = TelemetryDelta()

    def on_step(self, record: Any) -> None:
        self.delta.num_steps += 1
        self.delta.num_prefill_tokens += int(record.num_prefill_tokens)
        self.delta.num_decode_tokens += int(record.num_decode_tokens)

    def on_request_finished(self, timeline: Any) -> None:
        self.delta.finished.append(timeline_record(timeline))

    def close(self) -> None:
        pass

    def take(self) -> TelemetryDelta:
        delta, self.delta = self.delta, TelemetryDelta()
        return delta


class LLMEngineAdapter:
    """cadence.engine.llm_engine.LLMEngine seen through the EngineCore protocol."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.max_model_len = int(engine.max_model_len)
        self.vocab_size = int(self.tokenizer.vocab_size)
        self._telemetry = _TelemetryCollector()
        engine.telemetry.add_listener(self._telemetry)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages,
                                                  add_generation_prompt=add_generation_prompt)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def default_eos_token_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokenizer.stop_token_ids)

    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None) -> None:
        self.engine.add_request(req_id, prompt_token_ids, params, priority=priority,
                                arrival_time=arrival_time)

    def abort_request(self, req_id: str) -> None:
        self.engine.abort_request(req_id)

    def step(self) -> Sequence[Any]:
        return self.engine.step()

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished())

    def take_telemetry(self) -> TelemetryDelta:
        return self._telemetry.take()

    def stats(self) -> dict[str, Any]:
        return dataclasses.asdict(self.engine.scheduler.stats())

    def close(self) -> None:
        self.engine.close()


def _rebuild_dataclass(cls: type, data: Mapping[str, Any]) -> Any:
    """Frozen config dataclass from its JSON dict (nested dataclass fields rebuilt too)."""
    import typing

    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        hint = hints.get(f.name)
        if isinstance(value, dict) and dataclasses.is_dataclass(hint):
            value = _rebuild_dataclass(hint, value)
        kwargs[f.name] = value
    return cls(**kwargs)


def build_llm_engine(engine_config: Mapping[str, Any], served_model_name: str | None) -> EngineCore:
    """Default engine factory: EngineConfig (as a dict) -> LLMEngine behind the adapter."""
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine

    cfg = _rebuild_dataclass(EngineConfig, engine_config)
    engine = LLMEngine(cfg)
    return LLMEngineAdapter(engine, served_model_name or engine.model_name)


@dataclass(frozen=True)
class EngineProcessConfig:
    """What the engine process needs, JSON-serializable (it crosses the process boundary).

    `engine_factory` is "module:function" taking (engine_config dict, served_model_name) and
    returning an EngineCore; tests point it at a fake engine.
    """

    engine_config: dict[str, Any]
    served_model_name: str | None = None
    limits: AdmissionLimits = AdmissionLimits()
    engine_factory: str = "cadence.engine.engine_process:build_llm_engine"
    engine_threads: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EngineProcessConfig:
        data = json.loads(text)
        data["limits"] = AdmissionLimits(**data.get("limits", {}))
        return cls(**data)


def build_engine(cfg: EngineProcessConfig) -> EngineCore:
    module_name, _, func_name = cfg.engine_factory.partition(":")
    factory = getattr(importlib.import_module(module_name), func_name)
    return factory(cfg.engine_config, cfg.served_model_name)


def set_torch_threads(num_threads: int | None) -> None:
    """Give the engine the cores; only touches torch if something already needs it."""
    if num_threads is None or "torch" not in sys.modules:
        return
    import torch

    torch.set_num_threads(num_threads)


def serve_engine(cfg: EngineProcessConfig, context: Any, input_addr: str, output_addr: str,
                 parent_pid: int | None = None) -> None:
    """Connect to the front end's sockets, build the engine, announce ready, run the loop."""
    import zmq

    in_socket = context.socket(zmq.PULL)
    out_socket = context.socket(zmq.PUSH)
    in_socket.setsockopt(zmq.LINGER, 0)
    out_socket.setsockopt(zmq.LINGER, 5000)  # let the final batch reach the front end
    in_socket.connect(input_addr)
    out_socket.connect(output_addr)
    try:
        try:
            engine = build_engine(cfg)
            set_torch_threads(cfg.engine_threads)
        except Exception as exc:
            traceback.print_exc()
            out_socket.send(encode_message(EngineFatal(f"{type(exc).__name__}: {exc}")))
            raise
        out_socket.send(encode_message(EngineReady(
            model_name=engine.model_name, max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size, pid=os.getpid(), stats=engine.stats())))
        try:
            EngineCoreLoop(engine, in_socket, out_socket, cfg.limits, parent_pid).run()
        finally:
            close = getattr(engine, "close", None)
            if callable(close):
                close()  # flush trace files
    finally:
        in_socket.close()
        out_socket.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m cadence.engine.engine_process INPUT_ADDR OUTPUT_ADDR` with the config on stdin."""
    import signal

    import zmq

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m cadence.engine.engine_process INPUT_ADDR OUTPUT_ADDR "
              "< config.json", file=sys.stderr)
        return 2
    # Ctrl-C reaches the whole process group; the front end decides how to shut down and tells
    # this process with a Shutdown message (SIGTERM still stops it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg = EngineProcessConfig.from_json(sys.stdin.read())
    context = zmq.Context()
    try:
        serve_engine(cfg, context, argv[0], argv[1], parent_pid=os.getppid())
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
