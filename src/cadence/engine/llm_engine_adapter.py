"""The real LLMEngine behind the EngineCore protocol, and the default engine factory.

Telemetry: the engine's own recorder (cadence.telemetry) times every request on the monotonic
clock, arrival stamped by the front end when the HTTP request came in (CLOCK_MONOTONIC is
system-wide on one host). A listener here buffers finished timelines and step token counts;
the loop ships them inside each batch with the scheduler stats and the front end feeds them
into its Prometheus registry. The front end never computes engine metrics itself.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from cadence.core.sampling_params import SamplingParams
from cadence.engine.chat_render import render_chat
from cadence.engine.engine_core import EngineCore, TelemetryDelta
from cadence.engine.template_pool import TemplatePool
from cadence.engine.wire import step_record, timeline_record


class _TelemetryCollector:
    """A cadence.telemetry listener that buffers what the front end's metrics need."""

    MAX_STEPS = 1024

    def __init__(self) -> None:
        self.delta = TelemetryDelta()

    def on_step(self, record: Any) -> None:
        self.delta.num_steps += 1
        self.delta.num_prefill_tokens += int(record.num_prefill_tokens)
        self.delta.num_decode_tokens += int(record.num_decode_tokens)
        steps = self.delta.steps
        if len(steps) < self.MAX_STEPS:  # a front end that stopped reading must not grow us
            steps.append(step_record(record))

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
        cache = engine.scheduler.cache
        # Tokens the whole KV pool can hold: admission refuses requests that need more. A
        # sliding-window model holds only its window (and a chunk) whatever the length.
        kv = engine.scheduler.kv
        self.kv_capacity_tokens = int(cache.num_blocks) * int(cache.block_size)
        if kv.sliding_window is not None and kv.max_live_blocks(
                self.max_model_len, engine.scheduler.sched.max_num_batched_tokens) <= kv.num_blocks:
            self.kv_capacity_tokens = self.max_model_len
        # Bounds a text's token count from its length, before tokenizing it (admission).
        self.max_token_chars = int(self.tokenizer.max_token_chars())
        self._telemetry = _TelemetryCollector()
        engine.telemetry.add_listener(self._telemetry)
        self.generation_defaults: dict[str, Any] = {}
        self.summary = engine.summary()
        # Chat templates are untrusted code: rendered in worker processes under OS limits.
        self.templates = TemplatePool()

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                    chat_template: str | None = None,
                    continue_final_message: bool = False,
                    chat_template_kwargs: dict[str, Any] | None = None) -> str:
        return render_chat(self.tokenizer, messages, chat_template, add_generation_prompt,
                           continue_final_message, templates=self.templates,
                           template_kwargs=chat_template_kwargs)

    def prepare_request(self, req_id: str, params: SamplingParams) -> SamplingParams:
        """The request's setup (stop strings, bad words, token edits, grammar), in an
        admission thread (LLMEngine.prepare_request; ValueError: a 400)."""
        return self.engine.prepare_request(req_id, params)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def token_pieces(self, token_ids: list[int]) -> list[str]:
        """The vocabulary's own strings of the tokens (e.g. "Ġthe"; transformers'
        convert_ids_to_tokens), as vLLM's /tokenize returns them with return_token_strs."""
        backend = self.tokenizer.backend
        return [backend.id_to_token(t) or "" for t in token_ids]

    def default_eos_token_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokenizer.stop_token_ids)

    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None,
                    cache_salt: str | None = None) -> None:
        self.engine.add_request(req_id, prompt_token_ids, params, priority=priority,
                                arrival_time=arrival_time, cache_salt=cache_salt)

    def abort_request(self, req_id: str) -> None:
        self.engine.abort_request(req_id)

    def step(self) -> Sequence[Any]:
        return self.engine.step()

    def set_interjection_hooks(self, poll: Any, emit: Any) -> None:
        """The loop's poll for arrivals during a step and its sender of interjected outputs
        (LLMEngine.set_interjection_hooks)."""
        self.engine.set_interjection_hooks(poll, emit)

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished())

    def take_telemetry(self) -> TelemetryDelta:
        return self._telemetry.take()

    def stats(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.engine.scheduler.stats())
        split = self.engine.split_stepper
        if split is not None:  # --core-split: the split and the teams' utilisation
            out.update(split.stats())
        return out

    def close(self) -> None:
        self.templates.close()
        self.engine.close()


def _rebuild_dataclass(cls: type, data: Mapping[str, Any]) -> Any:
    """Frozen config dataclass from its JSON dict (nested dataclass fields rebuilt too)."""
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
    # Imported here: the engine process imports this module before it knows it needs torch.
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine

    from cadence.engine.model_overrides import generation_defaults

    cfg = _rebuild_dataclass(EngineConfig, engine_config)
    defaults = generation_defaults(cfg)
    engine = LLMEngine(cfg)
    adapter = LLMEngineAdapter(engine, served_model_name or engine.model_name)
    adapter.generation_defaults = defaults
    return adapter
