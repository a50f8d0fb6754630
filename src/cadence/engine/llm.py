"""The offline API, shaped as vLLM's: `LLM(...).generate(prompts, sampling_params)`.

    llm = LLM(policy="chunked", max_num_batched_tokens=256, dtype="float32")
    outs = llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=16), use_tqdm=False)
    [o.outputs[0].text for o in outs]

Prompts may be text, token ids, or vLLM's `{"prompt": ...}` / `{"prompt_token_ids": [...]}`
dicts. Results are `llm_outputs.RequestOutput` (vLLM's shape plus cadence's timeline).
Keyword arguments of `LLM()` are the fields of EngineConfig, SchedulerConfig and CacheConfig by
their user-facing names (`option_names.py`: the same names as `cadence serve` flags).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import SampledToken
from cadence.core.sampling_params import SamplingParams
from cadence.engine.chat_render import render_chat, text_messages
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.llm_outputs import CompletionOutput, Logprob, RequestOutput
from cadence.engine.option_names import user_option_fields
from cadence.engine.progress import GenerationProgress
from cadence.engine.tokenization_kwargs import PromptTruncation, prompt_truncation
from cadence.engine.vllm_options import VLLM_OPTIONS, check_vllm_options, vllm_mapped

# A step that runs nothing while requests wait means the scheduler cannot place them; this many
# in a row is a bug worth an error rather than a hang.
_MAX_IDLE_STEPS = 1000


@dataclass
class _Child:
    """One completion (one engine request) of one prompt."""

    req_id: str
    prompt_index: int
    index: int
    params: SamplingParams
    texts: list[str] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[SampledToken] = dataclasses.field(default_factory=list)
    prompt_logprobs: tuple[SampledToken, ...] | None = None
    final: Any = None


def engine_config_from_kwargs(model: str | None = None, **kwargs: Any) -> EngineConfig:
    """Route flat keyword arguments (user-facing option names) to EngineConfig /
    SchedulerConfig / CacheConfig fields."""
    groups: dict[type, dict[str, Any]] = {SchedulerConfig: {}, CacheConfig: {}, EngineConfig: {}}
    options = user_option_fields()  # user name -> (config class, field name)
    vllm: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key == "enable_chunked_prefill":  # vLLM's switch, onto cadence's policies
            if value is not None:
                groups[SchedulerConfig]["policy"] = "chunked" if value else "eager"
            continue
        if key in VLLM_OPTIONS and key not in options:
            vllm[key] = value  # vLLM's options: same meaning, a warning, or a clear refusal
            continue
        if key not in options:
            raise TypeError(f"unknown LLM option {key!r}; known options: "
                            f"{', '.join(sorted(options) + ['enable_chunked_prefill'])}")
        cls, name = options[key]
        groups[cls][name] = value
    check_vllm_options(vllm, spell="keyword")  # SERVER options (CORS, names) mean nothing here
    for name, value in vllm_mapped(vllm).items():  # gpu_memory_utilization; cadence's name wins
        groups[CacheConfig].setdefault(name, value)
    return EngineConfig(
        model=model,
        scheduler=SchedulerConfig(**groups[SchedulerConfig]),
        cache=CacheConfig(**groups[CacheConfig]),
        **groups[EngineConfig],
    )


class LLM:
    """Offline batch generation over one LLMEngine (vLLM's LLM class, on cadence)."""

    def __init__(self, model: str | None = None, **kwargs: Any):
        from cadence.engine.model_path import model_path_problem

        config = engine_config_from_kwargs(model, **kwargs)  # option mistakes first
        problem = model_path_problem(model)
        if problem:
            raise ValueError(problem)
        self.engine = LLMEngine(config)
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an existing engine (tests build one with LLMEngine.from_parts)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._ids = itertools.count()
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        """The model's tokenizer with the transformers calls vLLM's hands out (`hf_tokenizer`)."""
        from cadence.engine.hf_tokenizer import HFTokenizer

        return None if self.engine.tokenizer is None else HFTokenizer(self.engine.tokenizer)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config defaults (vLLM's method)."""
        from cadence.engine.model_overrides import generation_defaults

        cfg = self.engine.config
        return SamplingParams(**(generation_defaults(cfg) if cfg is not None else {}))

    def close(self) -> None:
        """Flush telemetry listeners (the --trace file)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt; results come back in prompt order.

        prompts: a str, token ids, `{"prompt": str}` / `{"prompt_token_ids": [...]}` (either
        may add vLLM's "cache_salt": prefix-cache blocks shared only within one salt), or a
        list of any of these. `use_tqdm` draws a progress bar on stderr (vLLM's name).
        `tokenization_kwargs` (vLLM's): {"truncate_prompt_tokens": k, "truncation_side":
        "left" | "right"} cuts every prompt as the server's fields of those names do."""
        items = _normalize_prompts(prompts)
        return self._run(items, sampling_params, use_tqdm, _cache_salts(prompts),
                         prompt_truncation(tokenization_kwargs))

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"} dicts) or a list of them,
        formatted with the model's chat template (or `chat_template`); `chat_template_kwargs`
        are extra template variables (vLLM's, e.g. {"enable_thinking": False} for Qwen3);
        `tokenization_kwargs` as in generate() (the rendered conversation is cut)."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template")
        if not isinstance(messages, Sequence) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        items = []
        for conv in conversations:
            text = render_chat(self.tokenizer, text_messages(list(conv)), chat_template,
                               add_generation_prompt, continue_final_message,
                               template_kwargs=chat_template_kwargs)
            # The template already spells out special tokens such as BOS.
            items.append((text, tuple(self.tokenizer.encode(text, add_special_tokens=False))))
        return self._run(items, sampling_params, use_tqdm,
                         truncation=prompt_truncation(tokenization_kwargs))

    # ---------------------------------------------------------------------------------------
    def _run(self, items, params, show, salts=None,
             truncation: PromptTruncation = PromptTruncation()) -> list[RequestOutput]:
        param_list = _normalize_params(params, len(items))
        if truncation.truncate_prompt_tokens is not None:
            param_list = [dataclasses.replace(p, truncate_prompt_tokens=truncation.
                                              truncate_prompt_tokens) for p in param_list]
        side = truncation.truncation_side
        salts = salts or [None] * len(items)
        engine = self.engine
        base = [f"{next(self._ids)}" for _ in items]
        children: dict[str, _Child] = {}
        # Completions 1..n-1 of a prompt wait until completion 0 has its first token: its
        # prompt blocks are then in the prefix cache, and the others reuse them.
        deferred: dict[str, list[_Child]] = {}
        prompt_ids: list[tuple[int, ...]] = []
        try:
            for k, ((_, prompt), p) in enumerate(zip(items, param_list)):
                first = _Child(base[k], k, 0, p)
                prompt_ids.append(engine.add_request(first.req_id, prompt, p,
                                                     cache_salt=salts[k], truncation_side=side))
                children[first.req_id] = first
                deferred[first.req_id] = [
                    _Child(f"{base[k]}-{i}", k, i, _child_params(p, i)) for i in range(1, p.n)]
        except Exception:
            for req_id in children:
                engine.abort_request(req_id)
            engine.step()  # drain the abort outputs so the engine is clean for the next call
            raise

        total = sum(p.n for p in param_list)
        num_final = 0
        with GenerationProgress(total, enabled=show) as progress:
            idle = 0
            while num_final < total:
                steps_before = engine.telemetry.num_steps_total
                outputs = engine.step()
                for out in outputs:
                    child = children.get(out.req_id)
                    if child is None:
                        continue
                    child.texts.append(out.new_text)
                    child.tokens.extend(out.new_token_ids)
                    if out.logprobs:
                        child.logprobs.extend(out.logprobs)
                    if out.prompt_logprobs is not None:
                        child.prompt_logprobs = out.prompt_logprobs
                    progress.tokens(len(out.new_token_ids))
                    for sibling in deferred.pop(out.req_id, ()):
                        engine.add_request(sibling.req_id, prompt_ids[sibling.prompt_index],
                                           sibling.params,
                                           cache_salt=salts[sibling.prompt_index],
                                           truncation_side=side)
                        children[sibling.req_id] = sibling
                    if out.finished:
                        child.final = out
                        num_final += 1
                        progress.finished()
                idle = idle + 1 if not outputs and engine.telemetry.num_steps_total == steps_before else 0
                if idle > _MAX_IDLE_STEPS:
                    raise RuntimeError(
                        f"engine made no progress for {_MAX_IDLE_STEPS} steps with "
                        f"{total - num_final} completions unfinished: {engine.scheduler.stats()}"
                    )

        by_prompt: dict[int, list[_Child]] = {}
        for child in children.values():
            by_prompt.setdefault(child.prompt_index, []).append(child)
        results = []
        for k, (prompt_text, _) in enumerate(items):
            outs = [self._completion(c) for c in sorted(by_prompt[k], key=lambda c: c.index)]
            results.append(RequestOutput(
                request_id=base[k], prompt=prompt_text, prompt_token_ids=list(prompt_ids[k]),
                outputs=outs, finished=True,
                num_cached_tokens=by_prompt[k][0].final.num_cached_tokens,
                timeline=outs[0].timeline,
                prompt_logprobs=self._prompt_logprobs(by_prompt[k][0].prompt_logprobs)))
        return results

    def _logprob_entry(self, s: SampledToken) -> dict[int, Logprob]:
        """{token_id: Logprob} of one output token: the alternatives ranked 1.. by logprob,
        the sampled token first (vLLM's order) with its rank among them."""
        ranked = sorted(s.top_logprobs, key=lambda kv: -kv[1])
        rank_of = {tok: k + 1 for k, (tok, _) in enumerate(ranked)}
        tok = self.tokenizer
        entries = [(s.token_id, s.logprob), *((t, lp) for t, lp in ranked if t != s.token_id)]
        return {t: Logprob(lp, rank_of.get(t, len(ranked) + 1),
                           None if tok is None else tok.decode([t], skip_special_tokens=False))
                for t, lp in entries}

    def _prompt_logprobs(self, scores: tuple[SampledToken, ...] | None
                         ) -> list[dict[int, Logprob] | None] | None:
        """vLLM's RequestOutput.prompt_logprobs: None for the first prompt token, then
        {token_id: Logprob} with the prompt token (its rank in the whole vocabulary) first and
        the top alternatives ranked 1..k."""
        if scores is None:
            return None
        tok = self.tokenizer

        def text(t: int) -> str | None:
            return None if tok is None else tok.decode([t], skip_special_tokens=False)

        entries: list[dict[int, Logprob] | None] = [None]
        for s in scores[1:]:
            entry = {s.token_id: Logprob(s.logprob, s.rank, text(s.token_id))}
            for k, (t, lp) in enumerate(s.top_logprobs):
                entry.setdefault(t, Logprob(lp, k + 1, text(t)))
            entries.append(entry)
        return entries

    def _completion(self, child: _Child) -> CompletionOutput:
        out = child.final
        logprobs = cumulative = sampled = None
        if child.logprobs:
            sampled = tuple(child.logprobs)
            logprobs = [self._logprob_entry(s) for s in sampled]
            cumulative = sum(s.logprob for s in sampled if s.logprob is not None)
        return CompletionOutput(
            index=child.index, text="".join(child.texts), token_ids=tuple(child.tokens),
            cumulative_logprob=cumulative, logprobs=logprobs, finish_reason=out.finish_reason,
            stop_reason=out.stop_reason, timeline=self.engine.telemetry.timeline(child.req_id),
            error=out.error, sampled=sampled)


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Completion `index` of n: a seeded request gets seed + index, so completions differ;
    prompt logprobs are the first completion's (the others then take its prefix blocks)."""
    if params.prompt_logprobs is not None:
        params = dataclasses.replace(params, prompt_logprobs=None)
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + index)


def _normalize_prompts(prompts: Any) -> list[tuple[str | None, str | tuple[int, ...]]]:
    """(prompt text or None, what the engine takes) per prompt."""
    if isinstance(prompts, str | Mapping):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, bytes) or not prompts:
        raise ValueError("prompts must be a str, a non-empty list of str, or lists of token ids")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [(None, tuple(prompts))]  # one prompt given as token ids
    items: list[tuple[str | None, str | tuple[int, ...]]] = []
    for p in prompts:
        if isinstance(p, str):
            items.append((p, p))
        elif isinstance(p, Mapping):  # vLLM's TextPrompt / TokensPrompt
            if "prompt_token_ids" in p:
                items.append((p.get("prompt"), tuple(p["prompt_token_ids"])))
            elif isinstance(p.get("prompt"), str):
                items.append((p["prompt"], p["prompt"]))
            else:
                raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got {p!r}")
        elif isinstance(p, Sequence):
            items.append((None, tuple(p)))
        else:
            raise ValueError(f"each prompt must be a str or a list of token ids, got {p!r}")
    return items


def _cache_salts(prompts: Any) -> list[str | None] | None:
    """vLLM's per-prompt "cache_salt" of prompt dicts, aligned with _normalize_prompts."""
    if isinstance(prompts, Mapping):
        prompts = [prompts]
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or \
            not any(isinstance(p, Mapping) for p in prompts):
        return None
    return [p.get("cache_salt") if isinstance(p, Mapping) else None for p in prompts]


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
