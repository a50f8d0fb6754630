"""The offline API: `LLM(...).generate(prompts, params)` runs a batch to completion.

    llm = LLM(policy="chunked", max_num_batched_tokens=256, dtype="float32")
    [r.text for r in llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=16))]

Keyword arguments are the fields of EngineConfig, SchedulerConfig and CacheConfig by name (the
knobs are vLLM's names), so the LLM constructor always accepts what the configs define.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import SampledToken
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.progress import GenerationProgress
from cadence.telemetry.request_timeline import RequestTimeline

# A step that runs nothing while requests wait means the scheduler cannot place them; this many
# in a row is a bug worth an error rather than a hang.
_MAX_IDLE_STEPS = 1000


@dataclass(frozen=True)
class GenerationResult:
    """One prompt's completion, in the order the prompts were given."""

    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    timeline: RequestTimeline | None
    num_cached_tokens: int = 0
    logprobs: tuple[SampledToken, ...] | None = None
    error: str | None = None


def engine_config_from_kwargs(model: str | None = None, **kwargs: Any) -> EngineConfig:
    """Route flat keyword arguments to EngineConfig / SchedulerConfig / CacheConfig fields."""
    groups: dict[type, dict[str, Any]] = {SchedulerConfig: {}, CacheConfig: {}, EngineConfig: {}}
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in groups}
    for key, value in kwargs.items():
        for cls in (SchedulerConfig, CacheConfig, EngineConfig):
            if key in names[cls] and key not in ("scheduler", "cache", "model"):
                groups[cls][key] = value
                break
        else:
            known = sorted(set().union(*names.values()) - {"scheduler", "cache"})
            raise TypeError(f"unknown LLM option {key!r}; known options: {', '.join(known)}")
    return EngineConfig(
        model=model,
        scheduler=SchedulerConfig(**groups[SchedulerConfig]),
        cache=CacheConfig(**groups[CacheConfig]),
        **groups[EngineConfig],
    )


class LLM:
    """Offline batch generation over one LLMEngine."""

    def __init__(self, model: str | None = None, *, show_progress: bool = False, **kwargs: Any):
        self.engine = LLMEngine(engine_config_from_kwargs(model, **kwargs))
        self.show_progress = show_progress
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine, show_progress: bool = False) -> LLM:
        """Wrap an existing engine (tests build one with LLMEngine.from_parts)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm.show_progress = show_progress
        llm._ids = itertools.count()
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def close(self) -> None:
        """Flush telemetry listeners (the --trace file)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        show_progress: bool | None = None,
    ) -> list[GenerationResult]:
        """Complete every prompt (text, or token ids); results come back in prompt order."""
        items = _normalize_prompts(prompts)
        return self._run([(p if isinstance(p, str) else None, p) for p in items], params,
                         show_progress)

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        show_progress: bool | None = None,
    ) -> list[GenerationResult]:
        """Reply to one conversation (a list of {"role", "content"} dicts) or a list of them,
        formatted with the model's chat template."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template")
        if not isinstance(messages, Sequence) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        items = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(list(conv), add_generation_prompt=True)
            # The template already spells out special tokens such as BOS.
            items.append((text, self.tokenizer.encode(text, add_special_tokens=False)))
        return self._run(items, params, show_progress)

    # ---------------------------------------------------------------------------------------
    def _run(self, items, params, show_progress) -> list[GenerationResult]:
        param_list = _normalize_params(params, len(items))
        engine = self.engine
        req_ids = [f"llm-{next(self._ids)}" for _ in items]
        prompt_ids: dict[str, tuple[int, ...]] = {}
        try:
            for req_id, (_, prompt), p in zip(req_ids, items, param_list):
                prompt_ids[req_id] = engine.add_request(req_id, prompt, p)
        except Exception:
            for req_id in prompt_ids:
                engine.abort_request(req_id)
            engine.step()  # drain the abort outputs so the engine is clean for the next call
            raise

        texts = {r: [] for r in req_ids}
        tokens = {r: [] for r in req_ids}
        logprobs: dict[str, list[SampledToken]] = {r: [] for r in req_ids}
        final: dict[str, Any] = {}
        show = self.show_progress if show_progress is None else show_progress
        with GenerationProgress(len(items), enabled=show) as progress:
            idle = 0
            while len(final) < len(req_ids):
                steps_before = engine.telemetry.num_steps_total
                outputs = engine.step()
                for out in outputs:
                    if out.req_id not in texts:
                        continue
                    texts[out.req_id].append(out.new_text)
                    tokens[out.req_id].extend(out.new_token_ids)
                    if out.logprobs:
                        logprobs[out.req_id].extend(out.logprobs)
                    progress.tokens(len(out.new_token_ids))
                    if out.finished:
                        final[out.req_id] = out
                        progress.finished()
                idle = idle + 1 if not outputs and engine.telemetry.num_steps_total == steps_before else 0
                if idle > _MAX_IDLE_STEPS:
                    raise RuntimeError(
                        f"engine made no progress for {_MAX_IDLE_STEPS} steps with "
                        f"{len(req_ids) - len(final)} requests unfinished: {engine.scheduler.stats()}"
                    )

        results = []
        for req_id, (prompt_text, _) in zip(req_ids, items):
            out = final[req_id]
            results.append(
                GenerationResult(
                    prompt=prompt_text,
                    prompt_token_ids=prompt_ids[req_id],
                    text="".join(texts[req_id]),
                    token_ids=tuple(tokens[req_id]),
                    finish_reason=out.finish_reason,
                    timeline=engine.telemetry.timeline(req_id),
                    num_cached_tokens=out.num_cached_tokens,
                    logprobs=tuple(logprobs[req_id]) if logprobs[req_id] else None,
                    error=out.error,
                )
            )
        return results


def _normalize_prompts(prompts: Any) -> list[str | tuple[int, ...]]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, bytes) or not prompts:
        raise ValueError("prompts must be a str, a non-empty list of str, or lists of token ids")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [tuple(prompts)]  # one prompt given as token ids
    items: list[str | tuple[int, ...]] = []
    for p in prompts:
        if isinstance(p, str):
            items.append(p)
        elif isinstance(p, Sequence):
            items.append(tuple(p))
        else:
            raise ValueError(f"each prompt must be a str or a list of token ids, got {p!r}")
    return items


def _normalize_params(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"{len(params)} SamplingParams for {n} prompts")
    for p in params:
        if not isinstance(p, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(p).__name__}")
    return params
