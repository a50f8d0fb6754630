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

Telemetry: this process timestamps every request (arrival from the front end's clock, first
scheduled, first token, each token, finish; `time.time()`, shared by processes on one host) and
ships the derived observations (finished-request latencies, inter-token gaps, step token counts,
scheduler stats) inside each batch; the front end feeds them into its Prometheus registry.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
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
    arrival_time: float = 0.0
    want_prompt_text: bool = False


@dataclass(frozen=True)
class AbortRequests:
    """Abort requests (client gone, shutdown). With `all_requests`, every live one."""

    req_ids: list[str] = field(default_factory=list)
    reason: str = "abort"
    all_requests: bool = False


@dataclass(frozen=True)
class GetStats:
    """Ask for a fresh stats snapshot; answered in the next batch's `stats_replies`."""

    nonce: int


@dataclass(frozen=True)
class Shutdown:
    """Abort everything still live (reason "abort"), send the final batch, exit."""

    reason: str = "shutdown"


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
    param, code}]; outputs: wire outputs (see `output_to_wire`); finished: per-request latency
    records; itl: inter-token gaps (seconds); iteration: [num_prefill_tokens, num_decode_tokens]
    of the step, or None; stats: scheduler stats after this turn.
    """

    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    iteration: list[int] | None = None
    stats: dict[str, Any] | None = None
    stats_replies: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.accepted or self.rejected or self.outputs or self.finished
                    or self.stats_replies)


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
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams)}


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

    def tokenize(self, text: str) -> list[int]: ...
    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def default_eos_token_ids(self) -> tuple[int, ...]: ...
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int) -> None: ...
    def abort_request(self, req_id: str) -> None: ...
    def step(self) -> Sequence[Any]: ...  # RequestOutput-like objects
    def has_unfinished(self) -> bool: ...
    def num_computed_tokens(self, req_id: str) -> int | None: ...
    def take_step_token_counts(self) -> tuple[int, int] | None: ...
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
        "error": None,
    }


# ---- per-request timing ----------------------------------------------------------------------


@dataclass
class _LiveRequest:
    """Engine-side bookkeeping for one admitted request (times from time.time())."""

    req_id: str
    num_prompt_tokens: int
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0

    @property
    def queued(self) -> bool:
        # "Queued" for admission limits = admitted, first token not yet produced.
        return self.first_token_time is None

    def latency_record(self, now: float, finish_reason: str | None) -> dict[str, Any]:
        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else max(0.0, b - a)

        ttft = span(self.arrival_time, self.first_token_time)
        e2e = span(self.arrival_time, now)
        tpot = None
        if ttft is not None and e2e is not None and self.num_output_tokens > 1:
            tpot = (e2e - ttft) / (self.num_output_tokens - 1)
        return {
            "req_id": self.req_id,
            "finish_reason": finish_reason or "abort",
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "prefilled": self.first_token_time is not None,
            "ttft": ttft,
            "e2e": e2e,
            "tpot": tpot,
            "queue_time": span(self.arrival_time, self.first_scheduled_time),
            "prefill_time": span(self.first_scheduled_time, self.first_token_time),
            "decode_time": span(self.first_token_time, now),
        }


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
            return self.engine.tokenize(text)
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
        self.engine.add_request(msg.req_id, ids, params, msg.priority)
        self._live[msg.req_id] = _LiveRequest(msg.req_id, n, msg.arrival_time or time.time())
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
        now = time.time()
        batch.finished.append(live.latency_record(now, reason))
        if notify:
            batch.outputs.append({
                "req_id": req_id, "token_ids": [], "text": "", "finished": True,
                "finish_reason": reason, "num_prompt_tokens": live.num_prompt_tokens,
                "num_output_tokens": live.num_output_tokens, "num_cached_tokens": 0,
                "logprobs": None, "error": error,
            })

    def _abort(self, msg: AbortRequests, batch: EngineBatch) -> None:
        ids = list(self._live) if msg.all_requests else msg.req_ids
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
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
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
            self._abort(AbortRequests(all_requests=True), batch)
            self._running = False

    def _record_step(self, outputs: Sequence[Any], step_start: float, now: float,
                     batch: EngineBatch) -> None:
        for live in self._live.values():
            if live.first_scheduled_time is None:
                computed = self.engine.num_computed_tokens(live.req_id)
                if computed:
                    live.first_scheduled_time = step_start
        for out in outputs:
            live = self._live.get(out.req_id)
            if live is None:
                continue  # aborted between the step and now: its client was already told
            wire = output_to_wire(out, self.engine.token_text)
            k = len(wire["token_ids"])
            if k:
                if live.first_scheduled_time is None:
                    live.first_scheduled_time = step_start
                if live.first_token_time is None:
                    live.first_token_time = now
                else:
                    # One gap per delivery, k - 1 zeros for tokens that really came together.
                    batch.itl.append(now - (live.last_token_time or now))
                    batch.itl.extend([0.0] * (k - 1))
                live.last_token_time = now
                live.num_output_tokens += k
            batch.outputs.append(wire)
            if wire["finished"]:
                self._live.pop(out.req_id, None)
                batch.finished.append(live.latency_record(now, wire["finish_reason"]))
        counts = self.engine.take_step_token_counts()
        batch.iteration = list(counts) if counts is not None else None

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
            step_start = time.time()
            try:
                outputs = self.engine.step()
            except Exception as exc:
                self._fail_all(exc, batch)
            else:
                self._record_step(outputs, step_start, time.time(), batch)
        if not batch.is_empty() or batch.iteration is not None:
            batch.stats = self.engine.stats()
            self.out_socket.send(encode_message(batch))
        return self._running

    def run(self) -> None:
        while self.run_once():
            pass


# ---- building the engine ----------------------------------------------------------------------


class LLMEngineAdapter:
    """cadence.engine.llm_engine.LLMEngine seen through the EngineCore protocol."""

    def __init__(self, engine: Any, model_name: str, max_model_len: int) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = int(self.tokenizer.vocab_size)
        self._step_counts: tuple[int, int] | None = None
        telemetry = getattr(engine, "telemetry", None)
        add_listener = getattr(telemetry, "add_listener", None)
        if callable(add_listener):
            add_listener(self._on_telemetry)

    def _on_telemetry(self, event: Any, *args: Any) -> None:
        # Step events carry the plan; request events are ignored (this process times requests).
        plan = getattr(event, "plan", None)
        if plan is None and args:
            plan = getattr(args[0], "plan", args[0])
        prefill = getattr(event, "num_prefill_tokens", getattr(plan, "num_prefill_tokens", None))
        decode = getattr(event, "num_decode_tokens", getattr(plan, "num_decode_tokens", None))
        if isinstance(prefill, int) and isinstance(decode, int):
            self._step_counts = (prefill, decode)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages,
                                                  add_generation_prompt=add_generation_prompt)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def default_eos_token_ids(self) -> tuple[int, ...]:
        ids = getattr(self.tokenizer, "stop_token_ids", None) or (self.tokenizer.eos_token_id,)
        return tuple(int(t) for t in ids if t is not None)

    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int) -> None:
        self.engine.add_request(req_id, prompt_token_ids, params, priority=priority)

    def abort_request(self, req_id: str) -> None:
        self.engine.abort_request(req_id)

    def step(self) -> Sequence[Any]:
        self._step_counts = None
        return self.engine.step()

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished())

    def _scheduler(self) -> Any:
        return getattr(self.engine, "scheduler", None)

    def num_computed_tokens(self, req_id: str) -> int | None:
        scheduler = self._scheduler()
        req = scheduler.get_request(req_id) if scheduler is not None else None
        return None if req is None else int(req.num_computed_tokens)

    def take_step_token_counts(self) -> tuple[int, int] | None:
        counts, self._step_counts = self._step_counts, None
        return counts

    def stats(self) -> dict[str, Any]:
        scheduler = self._scheduler()
        if scheduler is None:
            return {}
        stats = scheduler.stats()
        return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)


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
    name = served_model_name or getattr(engine, "model_name", None) or os.path.basename(
        (cfg.model or "default").rstrip("/"))
    return LLMEngineAdapter(engine, name, int(cfg.scheduler.max_model_len))


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
    torch_threads: int | None = None

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
            set_torch_threads(cfg.torch_threads)
        except Exception as exc:
            traceback.print_exc()
            out_socket.send(encode_message(EngineFatal(f"{type(exc).__name__}: {exc}")))
            raise
        out_socket.send(encode_message(EngineReady(
            model_name=engine.model_name, max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size, pid=os.getpid(), stats=engine.stats())))
        EngineCoreLoop(engine, in_socket, out_socket, cfg.limits, parent_pid).run()
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
