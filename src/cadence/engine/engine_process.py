"""The engine core in its own process: the LLMEngine step loop behind two ZeroMQ sockets.

Why a process: the HTTP front end (JSON, SSE, asyncio) and the step loop (torch) would share one
GIL; in separate processes the front end cannot steal engine time between steps.

This module is the process's entry and lifecycle: its config (EngineProcessConfig, JSON on
stdin), building the engine, the ready/fatal handshake, running the loop, exiting. The pieces
live next to it, one concept a file:

    wire.py                the messages on the sockets (JSON, never pickled objects)
    admission.py           prompt ids, length checks and back-pressure on admission
    engine_loop.py         EngineCoreLoop: messages in, one step, one batch out per turn
    engine_core.py         the EngineCore protocol the loop drives
    llm_engine_adapter.py  the real LLMEngine behind that protocol (default factory)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from cadence.engine.admission import AdmissionLimits
from cadence.engine.engine_core import EngineCore
from cadence.engine.engine_loop import EngineCoreLoop
from cadence.engine.llm_engine_adapter import build_llm_engine
from cadence.engine.tokenizer_info import tokenizer_info
from cadence.engine.wire import (
    EngineFatal,
    EngineHeartbeat,
    EngineReady,
    decode_message,
    encode_message,
)

# How often gauges are refreshed from the engine, whatever the engine is doing.
STATS_INTERVAL_S = 0.5

# Re-exported: EngineProcessConfig's field type, the engine factory older configs name
# ("cadence.engine.engine_process:build_llm_engine"), and the documented message codec.
__all__ = [
    "AdmissionLimits", "EngineProcessConfig", "build_engine", "build_llm_engine",
    "decode_message", "encode_message", "main", "serve_engine", "set_torch_threads",
]


@dataclass(frozen=True)
class EngineProcessConfig:
    """What the engine process needs, JSON-serializable (it crosses the process boundary).

    `engine_factory` is "module:function" taking (engine_config dict, served_model_name) and
    returning an EngineCore; tests point it at a fake engine.
    """

    engine_config: dict[str, Any]
    served_model_name: str | None = None
    limits: AdmissionLimits = AdmissionLimits()
    engine_factory: str = "cadence.engine.llm_engine_adapter:build_llm_engine"
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
            if not _is_user_error(exc):  # a bug: its traceback is for us; a user's mistake
                traceback.print_exc()  # is said in one line by the front end
            out_socket.send(encode_message(EngineFatal(f"{type(exc).__name__}: {exc}")))
            raise _StartupFailed from exc
        out_socket.send(encode_message(EngineReady(
            model_name=engine.model_name, max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size, pid=os.getpid(), stats=engine.stats(),
            max_token_chars=getattr(engine, "max_token_chars", None),
            generation_defaults=dict(getattr(engine, "generation_defaults", {}) or {}),
            summary=dict(getattr(engine, "summary", {}) or {}),
            tokenizer_info=tokenizer_info(getattr(engine, "tokenizer", None),
                                          engine.max_model_len))))
        heartbeat = StatsHeartbeat(engine, context, output_addr)
        heartbeat.start()
        try:
            EngineCoreLoop(engine, in_socket, out_socket, cfg.limits, parent_pid).run()
        finally:
            heartbeat.stop()
            close = getattr(engine, "close", None)
            if callable(close):
                close()  # flush trace files
    finally:
        in_socket.close()
        out_socket.close()


class StatsHeartbeat:
    """A daemon thread that pushes the scheduler's stats every `interval_s` on its own socket.

    The loop thread sends batches only between steps; during a long prefill step the gauges
    (running, waiting, KV usage) would freeze. Reading stats from here is safe: they are a few
    len() and counter reads, and the scheduler does not change while the executor computes
    (the compute releases the GIL, so this thread gets to run)."""

    def __init__(self, engine: EngineCore, context: Any, output_addr: str,
                 interval_s: float = STATS_INTERVAL_S) -> None:
        import threading

        self._engine = engine
        self._context = context
        self._addr = output_addr
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cadence-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self._interval_s + 1)

    def _run(self) -> None:
        import zmq

        sock = self._context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)  # nobody reading: drop heartbeats, never pile them up
        sock.connect(self._addr)
        try:
            while not self._stop.wait(self._interval_s):
                try:
                    stats = self._engine.stats()
                except Exception:  # a torn read mid-update: skip this beat
                    continue
                try:
                    sock.send(encode_message(EngineHeartbeat(stats)), zmq.NOBLOCK)
                except zmq.Again:
                    pass
        finally:
            sock.close()


class _StartupFailed(Exception):
    """The engine could not be built; the front end was told why."""


def _is_user_error(exc: BaseException) -> bool:
    """A model that does not load or a bad setting: the message says it all."""
    from cadence.model.errors import ModelLoadError

    return isinstance(exc, ModelLoadError | ValueError | FileNotFoundError | MemoryError)


def _configure_logging() -> None:
    """The engine's progress lines (model load, kernel build) on stderr, next to the server's."""
    import logging

    root = logging.getLogger("cadence")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     [cadence.engine] %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False


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
    _configure_logging()
    context = zmq.Context()
    try:
        serve_engine(cfg, context, argv[0], argv[1], parent_pid=os.getppid())
    except _StartupFailed:
        return 1  # already reported (to the front end, and a traceback if it was a bug)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
