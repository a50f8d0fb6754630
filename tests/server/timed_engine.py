"""A real LLMEngine (scheduler, step loop, telemetry, trace writer) whose executor is the
FakeExecutor plus a known step cost slept on the wall clock: STEP_BASE_S + PREFILL_TOKEN_S per
prompt token. Sleeping (not computing) keeps the step times close to the model on a loaded host,
so interference tests can name exact causes. Started with
`cadence serve --engine-factory timed_engine:build_timed_engine` (server_harness puts this
folder on the engine process's path)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.scheduler import Scheduler
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.llm_engine_adapter import LLMEngineAdapter
from cadence.executor.fake_executor import FakeExecutor
from cadence.model.tokenizer import Tokenizer
from cadence.telemetry.trace_writer import TraceWriter

STEP_BASE_S = 0.010
PREFILL_TOKEN_S = 0.001


def _ascii_tokenizer() -> Tokenizer:
    """One token per printable ASCII character, space and newline; <|im_end|> is EOS."""
    def char(b: int) -> str:
        return chr(b) if 33 <= b <= 126 else chr(256 + b)

    vocab = {char(b): i for i, b in enumerate([10, 32, *range(33, 127)])}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|im_end|>", special=True),
                                AddedToken("<|im_start|>", special=True)])
    return Tokenizer(backend, eos_token_id=backend.token_to_id("<|im_end|>"),
                     chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


class SleepingFakeExecutor(FakeExecutor):
    # Ten "layers": an interjected short prompt (LLMEngine.set_interjection_hooks) runs after
    # one of them, so it waits at most a tenth of a long step.
    num_pause_points = 9

    def execute(self, plan, between_layers=None):
        step_s = STEP_BASE_S + PREFILL_TOKEN_S * plan.num_prefill_tokens
        if between_layers is None:
            time.sleep(step_s)
            return super().execute(plan)
        layer_s = step_s / (self.num_pause_points + 1)

        def after_a_layer() -> None:
            time.sleep(layer_s)
            between_layers()

        out = super().execute(plan, after_a_layer)
        time.sleep(layer_s)
        return out


def build_timed_engine(engine_config: dict[str, Any], served_model_name: str | None):
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    sched = SchedulerConfig(**{k: v for k, v in (engine_config.get("scheduler") or {}).items()
                               if k in fields})
    sched = dataclasses.replace(sched, max_model_len=min(sched.max_model_len, 4096))
    tokenizer = _ascii_tokenizer()
    engine = LLMEngine.from_parts(Scheduler(sched, CacheConfig(block_size=16, num_blocks=2048)),
                                  SleepingFakeExecutor(vocab_size=96), tokenizer)
    if engine_config.get("trace_path"):
        engine.telemetry.add_listener(TraceWriter(
            engine_config["trace_path"], stall_target_s=sched.target_itl_ms / 1000.0,
            meta={"model": "timed-fake", "scheduler": dataclasses.asdict(sched)}))
    return LLMEngineAdapter(engine, served_model_name or "timed-fake")
