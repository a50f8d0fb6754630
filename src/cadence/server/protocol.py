"""OpenAI request bodies as pydantic models (pydantic lives in cadence/server only).

Strict mode: a JSON string where a number belongs is a 400, not silently converted. Every field
of OpenAI's and vLLM's completions and chat schemas is either honoured or, when cadence lacks
the feature, answered with a 400 naming the field (`UNSUPPORTED_FIELDS`); metadata fields
(`user`, `metadata`, ...) are accepted. Sampling fields left unset take the model's
generation_config defaults (then cadence's).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cadence.core.prompt_truncation import COMPLETIONS_DEFAULT_MAX_TOKENS
from cadence.engine.admission import MAX_LOGIT_BIAS_ENTRIES, MAX_STOP_CHARS, MAX_STOP_STRINGS
from cadence.engine.chat_render import chat_template_kwargs_problem

# OpenAI caps logprobs alternatives at 20 (as does SamplingParams).
MAX_LOGPROBS = 20
# A request's seed: a signed 64-bit integer, as vLLM bounds it (torch.long's range).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# The engine's bounds on lists whose setup grows with them (stop strings: a matcher table per
# string; logit_bias: tensors built at admission, indexed on every step), checked here first.
MAX_STOP_SEQUENCES = MAX_STOP_STRINGS


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
        # The path quotes keys with backslash escapes: a key that is itself a lone surrogate
        # must not make the path (the error's `param`) unencodable too.
        key_path = (f"{path}." if path else "") + printable_key(key)
        if isinstance(key, str) and unencodable_string_path(key) is not None:
            return key_path
        found = unencodable_string_path(item, key_path)
        if found:
            return found
    return None


def printable_key(key: Any) -> str:
    """A dict key or list index as text UTF-8 can carry (lone surrogates as \\udXXXX)."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")


class APIRequest(BaseModel):
    """The base of every request body: the checks each route's body gets in one place.

    Strict types, and no string anywhere in the JSON (dict keys included) that UTF-8 cannot
    encode: such a string is a 400 naming its path before any field is validated (pydantic
    itself cannot even carry it in an error message)."""

    model_config = ConfigDict(strict=True)

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


# A logit_bias key: a token id in ASCII digits (str.isdigit() also takes "²", which int() refuses).
TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,12}")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = False
    # vLLM's: every chunk carries the usage so far (prompt, completion and total tokens).
    continuous_usage_stats: bool = False


# Fields of OpenAI's and vLLM's request schemas that cadence does not implement: sending one
# with anything but its neutral value is a 400 naming the field (never silently dropped).
# field -> (neutral values, what to say)
UNSUPPORTED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "best_of > 1 is not supported (use n)"),
    "use_beam_search": ((None, False), "beam search is not supported"),
    "suffix": ((None, ""), "suffix (fill-in-the-middle) is not supported"),
    "tools": ((None, []), "tool calling is not supported"),
    "tool_choice": ((None, "none", "auto"), "tool calling is not supported"),
    "functions": ((None, []), "function calling is not supported"),
    "function_call": ((None, "none"), "function calling is not supported"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    # (chat takes reasoning_effort and documents as chat template variables, as vLLM does)
    "reasoning_effort": ((None,), "reasoning_effort is a chat template variable: use "
                         "/v1/chat/completions"),
    "verbosity": ((None,), "verbosity is not supported"),
    "prompt_embeds": ((None,), "prompt_embeds are not supported"),
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "documents": ((None, []), "documents are a chat template variable: use "
                  "/v1/chat/completions"),
    "media_io_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "ec_transfer_params": ((None, {}), "encoder-cache transfer is not supported (text-only "
                           "models)"),
    "watermarking": ((None, False), "watermarking is not supported"),
    "logprob_token_ids": ((None,), "logprob_token_ids is not supported (use logprobs / "
                          "top_logprobs)"),
    "repetition_detection": ((None,), "repetition_detection is not supported"),
    "thinking_token_budget": ((None, -1), "thinking_token_budget is not supported: "
                              "cadence's reasoning parsers read the reply, they do not end "
                              "the thinking early"),
    "return_prompt_text": ((None, False), "return_prompt_text is not supported (POST "
                           "/tokenize with the messages returns the prompt's tokens)"),
    "structural_tag": ((None,), "structural_tag is not supported (use structured_outputs)"),
    "guided_whitespace_pattern": ((None,), "guided_whitespace_pattern is not supported"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "vllm_xargs": ((None, {}), "vllm_xargs is not supported"),
    "guided_decoding_backend": ((None, "llguidance", "auto"),
                                "only the llguidance grammar backend is available"),
}

# Fields accepted with no effect on generation (identifiers, routing, storage hints): OpenAI
# documents them as metadata, so honouring them means accepting them. Those whose type OpenAI
# or vLLM define are fields of SamplingRequestFields (a wrong type is a 400, as in vLLM);
# these, with no type to check, are kept as extras and ignored: vLLM's routed_experts_prompt_start
# (MoE routing records), return_token_offsets / return_mm_kwargs (its /render routes only).
UNTYPED_METADATA_FIELDS = ("routed_experts_prompt_start", "return_token_offsets",
                           "return_mm_kwargs")


def is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether `value` is one of the `neutral` values, type and all: Python has True == 1 and
    0 == False, so `best_of: true` or `use_beam_search: 0` would pass a plain `in`."""
    return any(type(value) is type(n) and value == n for n in neutral)


def prompt_logprobs_problem(value: int | None, stream: bool) -> str | None:
    """Why vLLM refuses this prompt_logprobs, or None. vLLM takes None, and 0 also when
    streamed (a stream has no place for them: nothing is returned); k > 0 only unstreamed and
    up to its default --max-logprobs (20); -1 (the whole vocabulary) is over that cap."""
    if value is None:
        return None
    if stream and (value > 0 or value == -1):
        return "prompt_logprobs are not available when stream=true (as in vLLM); 0 is allowed"
    if value < -1:
        return f"prompt_logprobs must be a non-negative integer or -1, got {value}"
    if value == -1:
        return (f"prompt_logprobs=-1 asks for the whole vocabulary; at most {MAX_LOGPROBS} "
                "alternatives are returned (vLLM's default --max-logprobs)")
    if value > MAX_LOGPROBS:
        return f"prompt_logprobs must be at most {MAX_LOGPROBS}, got {value}"
    return None


class SamplingRequestFields(APIRequest):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    # extra="allow": fields outside both schemas are kept so `unsupported_features` sees the
    # unsupported ones; fields nobody defines are ignored (clients send their own metadata).
    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # vLLM's range: a 64-bit signed integer (2**64 is a 400 there, and here).
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    priority: int = 0
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = None
    # vLLM's: logprobs of every prompt token with this many alternatives (not streamed; its
    # value classes are checked as vLLM checks them: prompt_logprobs_problem).
    prompt_logprobs: int | None = None
    # Disaggregated serving (vLLM's field): what a router tells a prefill or decode worker,
    # passed to the engine as is (cadence.disagg.worker documents the keys).
    kv_transfer_params: dict[str, Any] | None = None
    include_stop_str_in_output: bool = False
    # vLLM's output-text and vocabulary switches (SamplingParams documents each).
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's structured output fields (older guided_* spellings and the newer object).
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM's: keep only the last k prompt tokens (-1: as many as the context leaves beside
    # max_tokens; core/prompt_truncation.py).
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # Which end truncate_prompt_tokens cuts from: "left" (None) keeps the last k, "right" the
    # first k.
    truncation_side: Literal["left", "right"] | None = None
    # vLLM's: the prompt's and each choice's token ids in the response (server/token_ids.py).
    return_token_ids: bool | None = None
    # vLLM's: logprobs tokens as "token_id:<id>" (None: the server's
    # --return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's per-tenant prefix-cache isolation: blocks are shared only within one salt.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    # vLLM's: the response's id is "<cmpl|chatcmpl>-<request_id>" (an X-Request-Id header
    # wins); the engine keeps an id of its own, so two requests may share one.
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    # vLLM's: tokens per streamed chunk at least; cadence sends each token as it comes (the
    # same text, in more chunks), so only its range is checked.
    stream_interval: int | None = Field(default=None, ge=1)
    # Accepted without effect on generation, typed as OpenAI / vLLM type them (a list for
    # `user` is a 400, not silently taken). parallel_tool_calls=false does hold tool_choice
    # "required" to one call (tool_choice.py); length_penalty is beam search's (refused);
    # include_reasoning hides the reasoning a --reasoning-parser reads (chat only).
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    parallel_tool_calls: bool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    session_id: str | None = None
    length_penalty: float = 1.0
    include_reasoning: bool = True

    @field_validator("response_format")
    @classmethod
    def _json_schema_shape(cls, rf: dict[str, Any] | None) -> dict[str, Any] | None:
        # Checked while the body is parsed: the chat route derives its grammar and reasoning
        # mode from response_format before the rest of the request is judged, and a
        # json_schema without its object (null, missing, a list) was a 500 there.
        if rf is not None and rf.get("type") == "json_schema":
            schema = rf.get("json_schema")
            if not isinstance(schema, dict) or not isinstance(schema.get("schema", {}), dict):
                raise PydanticCustomError(
                    "json_schema_shape", "a json_schema response_format needs a 'json_schema' "
                    "object whose 'schema' is an object")
        return rf

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def unsupported_features(self) -> list[tuple[str, str]]:
        """(param, message) of each known OpenAI feature in the body that cadence lacks."""
        return self.common_unsupported()

    def common_unsupported(self) -> list[tuple[str, str]]:
        problems = []
        for name, value in (self.model_extra or {}).items():
            spec = UNSUPPORTED_FIELDS.get(name)
            if spec is not None and not is_neutral(value, spec[0]):
                problems.append((name, spec[1]))
        if self.stream_options is not None and not self.stream:
            problems.append(("stream_options", "stream_options is only allowed with stream=true"))
        problem = prompt_logprobs_problem(self.prompt_logprobs, self.stream)
        if problem:
            problems.append(("prompt_logprobs", problem))
        stops = self.stop_strings()
        if len(stops) > MAX_STOP_SEQUENCES:
            problems.append(("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed"))
        if any(s == "" for s in stops):
            problems.append(("stop", "stop sequences must be non-empty strings"))
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            problems.append(("stop", f"stop sequences must be at most {MAX_STOP_CHARS} "
                             "characters"))
        if self.logit_bias and len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            problems.append(("logit_bias", f"logit_bias takes at most {MAX_LOGIT_BIAS_ENTRIES} "
                             "entries"))
        elif self.logit_bias and not all(TOKEN_ID_KEY.fullmatch(k) for k in self.logit_bias):
            problems.append(("logit_bias", "logit_bias keys must be token ids (decimal "
                             "integers)"))
        rf = self.response_format
        if rf is not None and rf.get("type") not in ("text", "json_object", "json_schema"):
            problems.append(("response_format", "response_format type must be 'text', "
                             "'json_object' or 'json_schema'"))
        if len(self.structured_spec_fields()) > 1:
            problems.append((self.structured_spec_fields()[1], "give at most one of "
                             "response_format (json), guided_*, structured_outputs"))
        return problems

    def structured_spec_fields(self) -> list[str]:
        given = [name for name in ("guided_json", "guided_regex", "guided_choice",
                                   "guided_grammar", "structured_outputs")
                 if getattr(self, name) is not None]
        if self.response_format and self.response_format.get("type") in ("json_object",
                                                                         "json_schema"):
            given.insert(0, "response_format")
        return given

    def structured_outputs_spec(self) -> tuple[str, dict[str, Any]] | None:
        """(field, StructuredOutputsParams fields) of the grammar this request asks for."""
        fields = self.structured_spec_fields()
        if not fields:
            return None
        name = fields[0]
        if name == "response_format":
            rf = self.response_format
            if rf["type"] == "json_object":
                return name, {"json_object": True}
            return name, {"json": rf["json_schema"].get("schema", {})}
        if name == "structured_outputs":
            return name, dict(self.structured_outputs)
        kind = name.removeprefix("guided_")
        return name, {kind: getattr(self, name)}


class CompletionRequest(SamplingRequestFields):
    """POST /v1/completions."""

    # A string, token ids, or a batch of either.
    prompt: str | list[int] | list[str] | list[list[int]]
    # 0 only with echo (vLLM's): the prompt comes back, with its logprobs, and nothing else.
    max_tokens: int | None = Field(default=COMPLETIONS_DEFAULT_MAX_TOKENS, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    # vLLM's: the tokenizer's special tokens (BOS, ...) around a text prompt (not token ids).
    add_special_tokens: bool = True

    def unsupported_features(self) -> list[tuple[str, str]]:
        problems = self.common_unsupported()
        if self.max_tokens == 0 and not self.echo:
            problems.append(("max_tokens", "max_tokens must be at least 1 (0 only with "
                             "echo=true)"))
        return problems

    def echo_only(self) -> bool:
        """echo with max_tokens=0: the prompt alone (one token is generated, not shown)."""
        return self.echo and self.max_tokens == 0

    def prompt_logprobs_count(self) -> int | None:
        """Prompt logprobs to compute: the field, else echo's logprobs (vLLM's). A stream
        without echo has nowhere to show them (prompt_logprobs 0 is all it may ask for
        there): none are computed."""
        if self.stream and not self.echo:
            return None
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, or content parts of which only {"type": "text"} ones are supported.
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    # Tool calling: an assistant turn's calls, and the call a tool message answers.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning (vLLM's `reasoning`, or `reasoning_content` as clients
    # still send it), passed to the template under both names (interleaved thinking).
    reasoning: str | None = None
    reasoning_content: str | None = None


# vLLM's reasoning_effort values (a chat template variable).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def chat_template_variables(tools: list[dict[str, Any]] | None,
                            chat_template_kwargs: dict[str, Any] | None,
                            documents: list[dict[str, str]] | None,
                            reasoning_effort: str | None) -> dict[str, Any] | None:
    """The extra chat template variables, as vLLM passes them: the tools, then
    chat_template_kwargs, then documents and reasoning_effort (which win where given;
    reasoning_effort also sets enable_thinking unless chat_template_kwargs does). One rule for
    a chat completion and for /tokenize, so a chat counts the tokens its completion runs."""
    given = dict(chat_template_kwargs or {})
    variables = {"tools": tools, **given} if tools else given
    if documents is not None:
        variables["documents"] = documents
    if reasoning_effort is not None:
        variables["reasoning_effort"] = reasoning_effort
        if "enable_thinking" not in given:
            variables["enable_thinking"] = reasoning_effort != "none"
    return variables or chat_template_kwargs


class ChatCompletionRequest(SamplingRequestFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    chat_template: str | None = None
    # vLLM's: special tokens added to the rendered chat on top of what the template wrote.
    add_special_tokens: bool = False
    # Extra variables for the chat template (vLLM's), e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's tool calling; served when the server has a tool-call parser (serving_chat.py).
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM's chat template variables: `documents` for RAG templates, `reasoning_effort` (also
    # setting enable_thinking unless chat_template_kwargs does); template_variables().
    documents: list[dict[str, str]] | None = None
    reasoning_effort: ReasoningEffort | None = None

    def template_variables(self) -> dict[str, Any] | None:
        return chat_template_variables(self.tools, self.chat_template_kwargs, self.documents,
                                       self.reasoning_effort)

    def structured_spec_fields(self) -> list[str]:
        given = super().structured_spec_fields()
        if self.tool_choice not in (None, "auto", "none") and self.tools:
            given.insert(0, "tool_choice")  # "required" / a named function: a JSON grammar
        return given

    def structured_outputs_spec(self) -> tuple[str, dict[str, Any]] | None:
        fields = self.structured_spec_fields()
        if fields and fields[0] == "tool_choice":
            from cadence.server.tool_choice import forced_schema

            one = self.parallel_tool_calls is False
            return "tool_choice", {"json": forced_schema(self.tools, self.tool_choice, one)}
        return super().structured_outputs_spec()

    def effective_max_tokens(self) -> int | None:
        # max_completion_tokens is OpenAI's newer name; it wins when both are given.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def unsupported_features(self) -> list[tuple[str, str]]:
        problems = self.common_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            problems.append(("top_logprobs", "top_logprobs requires logprobs=true"))
        if (why := chat_template_kwargs_problem(self.chat_template_kwargs)) is not None:
            problems.append(("chat_template_kwargs", why))
        if self.continue_final_message:
            if self.add_generation_prompt:
                problems.append(("continue_final_message", "continue_final_message needs "
                                 "add_generation_prompt=false"))
            elif self.messages[-1].role != "assistant":
                problems.append(("continue_final_message", "continue_final_message needs a "
                                 "final assistant message"))
        return problems
