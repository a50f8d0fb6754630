"""A deterministic fake EngineCore for the process/messaging layer tests (no torch, no model).

Byte-level tokenizer (token = byte + 3; 1 = BOS, 2 = EOS). Each step every live request gets one
token: a lowercase letter derived from its tokens (greedy) or from (seed, output index), and EOS
after `prompt_len % 13 + 5` tokens unless ignore_eos. KV "blocks" are counted as ceil(tokens / 16)
per live request out of 1024, so tests can see them freed.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from cadence.core.sampling_params import SamplingParams
from cadence.engine.engine_core import TelemetryDelta
from cadence.engine.outputs import RequestOutput

BLOCK_SIZE = 16
NUM_BLOCKS = 1024
VOCAB = 259
EOS = 2


@dataclass
class _Req:
    req_id: str
    prompt: list[int]
    params: SamplingParams
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    text: str = ""


def _letter(tokens: list[int]) -> int:
    return ord("a") + (sum(tokens[-3:]) * 31 + len(tokens)) % 26 + 3


class FakeEngine:
    model_name = "fake-model"
    vocab_size = VOCAB
    # One token per UTF-8 byte, so one token never covers more than one character.
    max_token_chars = 1

    def __init__(self, max_model_len: int = 256, step_delay_s: float = 0.0,
                 max_running: int = 1_000_000, kv_capacity_tokens: int | None = None) -> None:
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens or NUM_BLOCKS * BLOCK_SIZE
        self.step_delay_s = step_delay_s
        # Requests past the first max_running (in arrival order) wait without tokens.
        self.max_running = max_running
        self.reqs: dict[str, _Req] = {}
        self.preemptions = 0
        self._telemetry = TelemetryDelta()

    # tokenizer side
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text.startswith("SLOW TOKENIZER"):
            time.sleep(3.0)  # a tokenizer busy for seconds (without holding the GIL)
        return [b + 3 for b in text.encode("utf-8")]

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        parts = [f"<{m['role']}>{m['content']}\n" for m in messages]
        return "".join(parts) + ("<assistant>" if add_generation_prompt else "")

    def token_text(self, token_id: int) -> str:
        return bytes([token_id - 3]).decode("utf-8", "replace") if token_id >= 3 else ""

    def default_eos_token_ids(self) -> tuple[int, ...]:
        return (EOS,)

    # engine side
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None) -> None:
        self.reqs[req_id] = _Req(req_id, list(prompt_token_ids), params,
                                 arrival=arrival_time or time.monotonic())

    def abort_request(self, req_id: str) -> None:
        req = self.reqs.pop(req_id, None)
        if req is not None:
            self._finished_record(req, "abort")

    def _finished_record(self, req: _Req, reason: str) -> None:
        now = time.monotonic()
        times = req.token_times
        ttft = times[0] - req.arrival if times else None
        e2e = now - req.arrival
        self._telemetry.finished.append({
            "req_id": req.req_id, "finish_reason": reason,
            "num_prompt_tokens": len(req.prompt), "num_output_tokens": len(req.output),
            "num_cached_tokens": 0, "num_preemptions": 0, "queue_time": 0.0 if times else None,
            "prefill_time": ttft, "ttft": ttft, "e2e": e2e,
            "decode_time": now - times[0] if times else None,
            "tpot": (e2e - ttft) / (len(times) - 1) if len(times) > 1 else None,
            "itl": [b - a for a, b in zip(times, times[1:])],
        })

    def take_telemetry(self) -> TelemetryDelta:
        delta, self._telemetry = self._telemetry, TelemetryDelta()
        return delta

    def has_unfinished(self) -> bool:
        return bool(self.reqs)

    def _next_token(self, req: _Req) -> int:
        p = req.params
        if not p.ignore_eos and len(req.output) >= len(req.prompt) % 13 + 5:
            return EOS
        if p.temperature == 0:
            return _letter(req.prompt + req.output)
        rng = random.Random(f"{p.seed}-{len(req.output)}") if p.seed is not None else random
        return ord("a") + rng.randrange(26) + 3

    def step(self) -> list[RequestOutput]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        outputs = []
        prefill = decode = 0
        for req in list(self.reqs.values())[: self.max_running]:
            if bytes(t - 3 for t in req.prompt) == b"CRASH":
                os._exit(3)  # simulate the engine process dying mid-step
            if req.output:
                decode += 1
            else:
                prefill += len(req.prompt)
            tok = self._next_token(req)
            req.output.append(tok)
            req.token_times.append(time.monotonic())
            finish = None
            new_text = ""
            if tok in req.params.eos_token_ids and not req.params.ignore_eos:
                finish = "stop"
            else:
                new_text = self.token_text(tok)
                req.text += new_text
                for s in req.params.stop:
                    cut = req.text.find(s)
                    if cut >= 0:
                        new_text = new_text[: max(0, len(new_text) - (len(req.text) - cut))]
                        req.text = req.text[:cut]
                        finish = "stop"
                        break
            if finish is None and len(req.output) >= req.params.max_tokens:
                finish = "length"
            if finish is not None:
                del self.reqs[req.req_id]
                self._finished_record(req, finish)
            outputs.append(RequestOutput(req.req_id, (tok,), new_text, finish is not None,
                                         finish, len(req.prompt), len(req.output),
                                         num_cached_tokens=0))
        self._telemetry.num_steps += 1
        self._telemetry.num_prefill_tokens += prefill
        self._telemetry.num_decode_tokens += decode
        return outputs

    def stats(self) -> dict[str, Any]:
        used = sum(-(-(len(r.prompt) + len(r.output)) // BLOCK_SIZE) for r in self.reqs.values())
        running = min(len(self.reqs), self.max_running)
        return {
            "num_running": running, "num_waiting": len(self.reqs) - running,
            "num_blocks_total": NUM_BLOCKS,
            "num_blocks_used": used, "num_blocks_free": NUM_BLOCKS - used,
            "num_blocks_cached": 0, "num_preemptions_total": self.preemptions,
            "prefix_cache_queries": 0, "prefix_cache_hits": 0,
        }


def build_fake_engine(engine_config: dict[str, Any], served_model_name: str | None) -> FakeEngine:
    engine = FakeEngine(max_model_len=int(engine_config.get("max_model_len", 256)),
                        step_delay_s=float(engine_config.get("step_delay_s", 0.0)),
                        max_running=int(engine_config.get("max_running", 1_000_000)),
                        kv_capacity_tokens=engine_config.get("kv_capacity_tokens"))
    if served_model_name:
        engine.model_name = served_model_name
    return engine
