"""OpenAI request bodies as pydantic models (pydantic lives in cadence/server only).

Strict mode: a JSON string where a number belongs is a 400, not silently converted. Unknown
fields are ignored (clients send `user`, `metadata`, ...), but known OpenAI features that cadence
does not implement are rejected with a clear message instead of being silently dropped
(see `unsupported_features`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# OpenAI caps logprobs alternatives at 20 (as does SamplingParams).
MAX_LOGPROBS = 20
MAX_STOP_SEQUENCES = 16


def unencodable_string_path(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string in `value` that UTF-8 cannot encode (JSON allows
    lone surrogates such as "\\ud800"; the tokenizer, the wire and every response cannot
    carry them), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        key_path = f"{path}.{key}" if path else str(key)
        found = unencodable_string_path(key, key_path) if isinstance(key, str) else None
        found = found or unencodable_string_path(item, key_path)
        if found:
            return found
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class SamplingRequestFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    priority: int = 0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted for compatibility; only their neutral values are supported.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None
    # Disaggregated serving (vLLM's field): what a router tells a prefill or decode worker,
    # passed to the engine as is (cadence.disagg.worker documents the keys).
    kv_transfer_params: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _reject_unencodable_strings(cls, data: Any) -> Any:
        path = unencodable_string_path(data)
        if path is not None:
            raise PydanticCustomError(
                "unencodable_string",
                "{param} holds a string that is not valid Unicode (a lone surrogate)",
                {"param": path})
        return data

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported_features(self) -> list[tuple[str, str]]:
        """(param, message) of each known OpenAI feature in the body that cadence lacks."""
        return self.common_unsupported()

    def common_unsupported(self) -> list[tuple[str, str]]:
        problems = []
        if self.n != 1:
            problems.append(("n", f"n={self.n} is not supported: cadence returns one choice (n=1)"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", "best_of > 1 is not supported"))
        if self.presence_penalty != 0.0:
            problems.append(("presence_penalty", "presence_penalty is not supported (use 0)"))
        if self.frequency_penalty != 0.0:
            problems.append(("frequency_penalty", "frequency_penalty is not supported (use 0)"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias is not supported"))
        if self.stream_options is not None and not self.stream:
            problems.append(("stream_options", "stream_options is only allowed with stream=true"))
        stops = self.stop_strings()
        if len(stops) > MAX_STOP_SEQUENCES:
            problems.append(("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed"))
        if any(s == "" for s in stops):
            problems.append(("stop", "stop sequences must be non-empty strings"))
        return problems


class CompletionRequest(SamplingRequestFields):
    """POST /v1/completions."""

    # A string, token ids, or a batch of exactly one of either.
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None

    def unsupported_features(self) -> list[tuple[str, str]]:
        problems = self.common_unsupported()
        if self.echo:
            problems.append(("echo", "echo=true is not supported"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported"))
        return problems


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, or content parts of which only {"type": "text"} ones are supported.
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequestFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    def effective_max_tokens(self) -> int | None:
        # max_completion_tokens is OpenAI's newer name; it wins when both are given.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def unsupported_features(self) -> list[tuple[str, str]]:
        problems = self.common_unsupported()
        if self.tools:
            problems.append(("tools", "tool calling is not supported"))
        if self.response_format and self.response_format.get("type", "text") != "text":
            problems.append(("response_format", "only response_format type 'text' is supported"))
        if self.top_logprobs is not None and not self.logprobs:
            problems.append(("top_logprobs", "top_logprobs requires logprobs=true"))
        return problems
