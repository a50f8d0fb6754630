"""Per-request sampling and stopping parameters (what the OpenAI and vLLM APIs expose)."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The grammar kinds a request may constrain its output with (vLLM's StructuredOutputsParams).
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Constrain the output to a grammar: exactly one field is set.

    json: a JSON schema (dict or its JSON text); json_object: any JSON object; regex: a
    regular expression; choice: one of these strings; grammar: a Lark grammar. Named as vLLM's
    `StructuredOutputsParams` (older vLLM: `GuidedDecodingParams`, same fields).
    """

    json: Any = None
    json_object: bool | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except ValueError as exc:
                raise ValueError(f"structured output json schema is not valid JSON: {exc}") from None
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured output choice must be a list of strings")
            if not self.choice:
                raise ValueError("structured output choice must not be empty")
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs take exactly one of json, json_object, regex, "
                             f"choice, grammar; got {given or 'none'}")

    @property
    def kind(self) -> str:
        return next(k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False))

    def to_dict(self) -> dict[str, Any]:
        value = getattr(self, self.kind)
        return {self.kind: list(value) if isinstance(value, tuple) else value}


# vLLM's older name for the same thing.
GuidedDecodingParams = StructuredOutputsParams


class RequestOutputKind(enum.IntEnum):
    """vLLM's output_kind. The offline LLM returns finished outputs whatever the kind; the
    server streams deltas; both are accepted so vLLM code constructs its params unchanged."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 means greedy. top_k <= 0 and top_p == 1 and min_p == 0 disable those filters.
    `seed` makes sampling reproducible per request, whatever else shares the batch: the executor
    derives the random draw for output token i from (seed, i) alone.

    Field names and meanings are vLLM's, so vLLM code constructs these unchanged: `stop` may be
    one string or several; `logit_bias` a {token_id: bias} dict; `n` completions per prompt
    share the prompt's KV blocks through the prefix cache.
    """

    # None: up to the context length (max_model_len - prompt), as vLLM; the engine resolves it.
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    min_tokens: int = 0
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token_id, bias) pairs, sorted by token id (a dict is accepted and converted).
    logit_bias: tuple[tuple[int, float], ...] = ()
    include_stop_str_in_output: bool = False
    # Logprobs of every prompt token (with this many alternatives), as vLLM's prompt_logprobs.
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's output text switches: special tokens' text is left out unless
    # skip_special_tokens=False; detokenize=False leaves `text` empty (token ids only).
    # spaces_between_special_tokens only changes slow (Python) tokenizers' output in vLLM;
    # cadence's tokenizers are fast ones, so both values give the same text.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    # Words never to generate (vLLM's bad_words): the engine turns each into its token ids
    # (with and without a leading space, as vLLM picks the variants); a word's last token is
    # banned whenever the output so far ends with the tokens before it.
    bad_words: tuple[str, ...] = ()
    # Only these token ids may be sampled (vLLM's allowed_token_ids).
    allowed_token_ids: tuple[int, ...] | None = None
    # Keep only the last k prompt tokens (vLLM's truncate_prompt_tokens; -1: as many as the
    # context leaves beside max_tokens; core/prompt_truncation.py).
    truncate_prompt_tokens: int | None = None
    # vLLM's older name for structured_outputs.
    guided_decoding: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled by the engine from the model (EOS id and extra end-of-turn ids); not user-facing.
    eos_token_ids: tuple[int, ...] = field(default=())
    # Filled by the engine: the token ids of bad_words; not user-facing. One-token words are
    # banned always; longer ones (prefix..., last) only after their prefix.
    bad_words_token_ids: tuple[int, ...] = field(default=())
    bad_words_sequences: tuple[tuple[int, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        # A single stop string is one stop string, never its characters.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is None:
            object.__setattr__(self, "stop", ())
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        for name in ("stop_token_ids", "eos_token_ids", "bad_words_token_ids"):
            value = getattr(self, name)
            object.__setattr__(self, name, () if value is None else tuple(value))
        object.__setattr__(self, "bad_words_sequences",
                           tuple(tuple(int(t) for t in s) for s in self.bad_words_sequences or ()))
        object.__setattr__(self, "logit_bias", _normalize_bias(self.logit_bias))
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("give structured_outputs or guided_decoding, not both")
            object.__setattr__(self, "structured_outputs", self.guided_decoding)
            object.__setattr__(self, "guided_decoding", None)
        if isinstance(self.structured_outputs, Mapping):
            object.__setattr__(self, "structured_outputs",
                               StructuredOutputsParams(**self.structured_outputs))
        if isinstance(self.bad_words, str):
            object.__setattr__(self, "bad_words", (self.bad_words,))
        object.__setattr__(self, "bad_words", tuple(self.bad_words or ()))
        if self.allowed_token_ids is not None:
            allowed = tuple(int(t) for t in self.allowed_token_ids)
            if not allowed or min(allowed) < 0:
                raise ValueError("allowed_token_ids must be a non-empty list of token ids >= 0")
            object.__setattr__(self, "allowed_token_ids", allowed)
        if self.truncate_prompt_tokens is not None and (
                self.truncate_prompt_tokens < 1 and self.truncate_prompt_tokens != -1):
            raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got "
                             f"{self.truncate_prompt_tokens}")
        object.__setattr__(self, "output_kind", RequestOutputKind(self.output_kind))
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int)
                                            or isinstance(self.max_tokens, bool)):
            raise ValueError(f"max_tokens must be an int or None, got {self.max_tokens!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs == -1:
            raise ValueError("logprobs=-1 (the whole vocabulary) is not supported: cadence "
                             "returns up to 20 alternatives per token (logprobs=20)")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise ValueError(f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= 128:
            raise ValueError(f"n must be an int in [1, 128], got {self.n!r}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 10 or math.isnan(self.repetition_penalty):
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias entries must be token id >= 0 with a bias in "
                                 f"[-100, 100], got {token_id}: {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def needs_history(self) -> bool:
        """The sampler reads the request's tokens: penalties, min_tokens masking, grammars,
        bad words of several tokens."""
        return (self.has_penalties or self.min_tokens > 0 or self.structured_outputs is not None
                or bool(self.bad_words_sequences))


def _normalize_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    if not bias:
        return ()
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        pairs = {int(k): float(v) for k, v in items}
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    return tuple(sorted(pairs.items()))
