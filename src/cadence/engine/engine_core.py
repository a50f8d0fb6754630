"""What the engine loop needs from an engine: the EngineCore protocol and its telemetry delta.

The engine process drives any EngineCore: the real LLMEngine behind LLMEngineAdapter
(cadence.engine.llm_engine_adapter), or a fake one in the server tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cadence.core.sampling_params import SamplingParams


@dataclass
class TelemetryDelta:
    """Telemetry gathered since the last drain: finished-request records, step token counts."""

    # One cadence.engine.wire.timeline_record dict per finished request.
    finished: list[dict[str, Any]] = field(default_factory=list)
    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # The steps themselves, as compact dicts (cadence.engine.wire.step_record): the front
    # end's interference attribution and live dashboard read them.
    steps: list[dict[str, Any]] = field(default_factory=list)


class EngineCore(Protocol):
    """The engine as the loop sees it: tokenizer side, request side, telemetry and stats."""

    model_name: str
    max_model_len: int
    vocab_size: int

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def default_eos_token_ids(self) -> tuple[int, ...]: ...
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None,
                    cache_salt: str | None = None) -> None: ...
    def abort_request(self, req_id: str) -> None: ...
    def step(self) -> Sequence[Any]: ...  # RequestOutput-like objects
    def has_unfinished(self) -> bool: ...
    def take_telemetry(self) -> TelemetryDelta: ...
    def stats(self) -> dict[str, Any]: ...
