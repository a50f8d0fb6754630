"""POST /v1/responses request body (OpenAI's Responses API, as vLLM serves it).

The request is served by the chat path: `responses_mapping.chat_body` turns it into a
ChatCompletionRequest (input items -> messages, text.format -> response_format, flat function
tools -> chat tools), so templating, sampling, structured output and tool-call reading are
the chat route's own. Fields of OpenAI's schema that cadence cannot honour are a 400 naming
the field (`UNSUPPORTED_RESPONSES_FIELDS`); fields nobody defines are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from cadence.server.protocol import (
    MAX_LOGPROBS, SEED_MAX, SEED_MIN, APIRequest, ReasoningEffort, is_neutral)

_EFFORTS = ReasoningEffort.__args__

# include values (OpenAI's ResponseIncludable). Honoured: the output text's token logprobs;
# reasoning.encrypted_content is accepted as vLLM accepts it: nothing is encrypted here, the
# reasoning item carries its text in `content` (encrypted_content null), which a follow-up
# request may send back as input. The rest name outputs of built-in tools or image inputs,
# which cadence never has: a 400 naming include.
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
INCLUDE_ACCEPTED = (OUTPUT_TEXT_LOGPROBS, "reasoning.encrypted_content")
INCLUDE_UNSUPPORTED = ("file_search_call.results", "web_search_call.results",
                       "web_search_call.action.sources", "message.input_image.image_url",
                       "computer_call_output.output.image_url", "code_interpreter_call.outputs")

# Fields of OpenAI's Responses schema that cadence lacks: anything but a neutral value is a
# 400 naming the field. field -> (neutral values, what to say)
UNSUPPORTED_RESPONSES_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((None, False), "background mode is not supported (run the request with "
                   "stream=true or wait for it)"),
    "conversation": ((None,), "conversations are not supported (send the items in input)"),
    "prompt": ((None,), "stored prompt templates are not supported (send instructions and "
               "input)"),
    "truncation": ((None, "disabled"), "truncation 'auto' is not supported"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported"),
    "stream_options": ((None,), "stream_options is not supported on /v1/responses"),
    "context_management": ((None,), "context_management is not supported"),
    "prompt_cache_retention": ((None,), "prompt_cache_retention is not supported"),
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
}

# Accepted without effect (OpenAI documents them as metadata or hints; vLLM accepts them too).
RESPONSES_METADATA_FIELDS = ("user", "metadata", "service_tier", "parallel_tool_calls",
                             "safety_identifier", "prompt_cache_key", "store")


class ResponsesRequest(APIRequest):
    """POST /v1/responses. Sampling fields mean what they mean on /v1/chat/completions."""

    # extra="allow": known-but-unsupported fields are named in a 400; unknown ones ignored.
    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    # A user message as text, or a list of items (messages, function calls and their outputs).
    input: str | list[dict[str, Any]]
    # A system message put first.
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Answered with OpenAI's default (true); the server keeps each stored response for a
    # later previous_response_id (responses_store.py).
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    # vLLM's extras on this route (as on chat).
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    priority: int = 0
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    chat_template_kwargs: dict[str, Any] | None = None
    # {"effort": ...}: chat's reasoning_effort (a chat template variable, also setting
    # enable_thinking). The reasoning comes back as a reasoning item with --reasoning-parser.
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # Output data to add (INCLUDE_ACCEPTED); "message.output_text.logprobs" puts the output
    # text's token logprobs on its output_text part and output_text.delta events.
    include: list[str] | None = None
    # Alternatives per token with those logprobs (without the include: none computed, as
    # vLLM does).
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def output_logprobs(self) -> int | None:
        """Alternatives per output token to compute (None: no logprobs asked for)."""
        if OUTPUT_TEXT_LOGPROBS not in (self.include or ()):
            return None
        return self.top_logprobs or 0

    def unsupported_features(self) -> list[tuple[str, str]]:
        """(param, message) of each Responses feature in the body that cadence lacks."""
        problems = []
        for name, value in (self.model_extra or {}).items():
            spec = UNSUPPORTED_RESPONSES_FIELDS.get(name)
            if spec is not None and not is_neutral(value, spec[0]):
                problems.append((name, spec[1]))
        for value in self.include or ():
            if value in INCLUDE_UNSUPPORTED:
                problems.append(("include", f"include {value!r} is not supported: cadence runs "
                                 "no built-in tools and takes no image inputs (supported: "
                                 + ", ".join(INCLUDE_ACCEPTED) + ")"))
            elif value not in INCLUDE_ACCEPTED:
                problems.append(("include", f"include {value!r} is not a known value "
                                 "(supported: " + ", ".join(INCLUDE_ACCEPTED) + ")"))
        for key, value in (self.reasoning or {}).items():
            if key == "effort" and value is not None and value not in _EFFORTS:
                problems.append(("reasoning.effort", "reasoning.effort must be one of "
                                 + ", ".join(_EFFORTS)))
            elif key in ("summary", "generate_summary") and value is not None:
                problems.append((f"reasoning.{key}", "reasoning summaries are not produced "
                                 "(with --reasoning-parser the reasoning item carries the "
                                 "model's own reasoning text)"))
            elif key not in ("effort", "summary", "generate_summary"):
                problems.append((f"reasoning.{key}", f"reasoning.{key} is not supported"))
        return problems
