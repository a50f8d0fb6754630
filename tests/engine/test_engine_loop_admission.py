"""The engine loop's admission threads (issue 31): per-request work runs beside the loop, a
slow request holds only itself, and work past its deadline is answered 503 (the loop never
waits for it). Real ZeroMQ sockets (inproc), a minimal engine with a slow tokenizer."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import zmq

from cadence.engine.admission import AdmissionLimits
from cadence.engine.engine_core import TelemetryDelta
from cadence.engine.engine_loop import EngineCoreLoop
from cadence.engine.wire import (
    AddRequest,
    EngineBatch,
    GetStats,
    Tokenize,
    decode_message,
    encode_message,
)


class SlowTokenizerEngine:
    """Tokenizes "slow..." texts for `slow_s` seconds; never steps (nothing to generate)."""

    model_name = "slow"
    vocab_size = 300
    max_model_len = 256
    max_token_chars = 1

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.release = threading.Event()
        self.added: list[str] = []

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text.startswith("slow"):
            self.release.wait(self.slow_s)
        return [b + 3 for b in text.encode()]

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return "".join(m["content"] for m in messages)

    def token_text(self, token_id: int) -> str:
        return chr(token_id - 3)

    def default_eos_token_ids(self) -> tuple[int, ...]:
        return (2,)

    def add_request(self, req_id: str, prompt_token_ids: list[int], params: Any,
                    priority: int, arrival_time: float | None) -> None:
        self.added.append(req_id)

    def has_unfinished(self) -> bool:
        return False

    def take_telemetry(self) -> TelemetryDelta:
        return TelemetryDelta()

    def stats(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def loop_sockets():
    ctx = zmq.Context.instance()
    to_engine, engine_in = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    engine_out, from_engine = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    name = f"inproc://admission-{time.monotonic_ns()}"
    engine_in.bind(name + "-in")
    to_engine.connect(name + "-in")
    from_engine.bind(name + "-out")
    engine_out.connect(name + "-out")
    yield to_engine, engine_in, engine_out, from_engine
    for sock in (to_engine, engine_in, engine_out, from_engine):
        sock.close(linger=0)


def _run_until(loop: EngineCoreLoop, from_engine: Any, done, timeout_s: float) -> EngineBatch:
    """Turn the loop until `done(merged batch)`; every batch it sent, merged."""
    merged = EngineBatch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loop.run_once()
        while from_engine.poll(0):
            batch = decode_message(from_engine.recv())
            merged.accepted += batch.accepted
            merged.rejected += batch.rejected
            merged.tokenize_replies += batch.tokenize_replies
        if done(merged):
            return merged
    raise AssertionError(f"not done after {timeout_s}s: {merged}")


def _add(req_id: str, text: str) -> bytes:
    return encode_message(AddRequest(req_id=req_id, sampling={"max_tokens": 4},
                                     prompt_text=text))


def test_slow_request_holds_only_itself(loop_sockets):
    to_engine, engine_in, engine_out, from_engine = loop_sockets
    engine = SlowTokenizerEngine(slow_s=30.0)
    loop = EngineCoreLoop(engine, engine_in, engine_out, AdmissionLimits())
    to_engine.send(_add("slow-1", "slow prompt"))
    to_engine.send(encode_message(Tokenize(nonce=7, text="slow text")))
    to_engine.send(_add("quick-1", "hello"))
    to_engine.send(encode_message(Tokenize(nonce=8, text="hi")))
    start = time.monotonic()
    merged = _run_until(loop, from_engine, lambda b: b.accepted and b.tokenize_replies, 15.0)
    # Well before the slow ones' 30 s (generous for a loaded host: usually milliseconds).
    assert time.monotonic() - start < 15.0
    assert [a["req_id"] for a in merged.accepted] == ["quick-1"]
    assert merged.tokenize_replies == [{"nonce": 8, "tokens": [107, 108]}]
    engine.release.set()  # the slow ones finish and are admitted / answered after all
    merged = _run_until(loop, from_engine, lambda b: b.accepted and b.tokenize_replies, 30.0)
    assert [a["req_id"] for a in merged.accepted] == ["slow-1"]
    assert merged.tokenize_replies[0]["nonce"] == 7
    loop._admission.shutdown(wait=False)


def test_work_past_its_deadline_is_503(loop_sockets, monkeypatch):
    to_engine, engine_in, engine_out, from_engine = loop_sockets
    monkeypatch.setattr(EngineCoreLoop, "ADMISSION_DEADLINE_S", 0.3)
    engine = SlowTokenizerEngine(slow_s=5.0)
    loop = EngineCoreLoop(engine, engine_in, engine_out, AdmissionLimits())
    to_engine.send(_add("slow-1", "slow prompt"))
    to_engine.send(encode_message(Tokenize(nonce=9, text="slow text")))
    merged = _run_until(loop, from_engine, lambda b: b.rejected and b.tokenize_replies, 30.0)
    rejected, reply = merged.rejected[0], merged.tokenize_replies[0]
    assert rejected["req_id"] == "slow-1" and rejected["status"] == 503
    assert rejected["code"] == "admission_timeout"
    assert reply["nonce"] == 9 and reply["status"] == 503 and reply["code"] == "admission_timeout"
    assert not loop._pending_admission()  # the loop no longer waits for them
    engine.release.set()
    time.sleep(0.2)  # the slow tokenization ends now; its result must be dropped
    to_engine.send(encode_message(GetStats(nonce=1)))  # a message, so run_once returns
    loop.run_once()
    assert engine.added == []
    loop._admission.shutdown(wait=False)
