"""OpenAI request bodies -> what the engine takes: sampling fields and the prompt.

Checks that need no tokenizer happen here (unsupported features, SamplingParams' own ranges,
max_tokens against the context); prompt-length checks happen in the engine process, which
owns the tokenizer, and come back as EngineRejected.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from cadence.core.prompt_truncation import tokens_to_keep
from cadence.core.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.engine.chat_render import text_messages
from cadence.engine.wire import sampling_to_wire
from cadence.server.errors import APIError
from cadence.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequestFields,
)


# Most prompts one /v1/completions request may batch.
MAX_BATCH_PROMPTS = 64


@dataclass(frozen=True)
class EnginePrompt:
    """Exactly one of the three is set."""

    text: str | None = None
    token_ids: list[int] | None = None
    chat_messages: list[dict[str, Any]] | None = None


def check_model(requested: str | None, served_name: str,
                aliases: tuple[str, ...] = ()) -> None:
    if requested is not None and requested != served_name and requested not in aliases:
        raise APIError(404, f"The model '{requested}' does not exist; this server serves "
                       f"'{served_name}'.", param="model", code="model_not_found")


def reject_unsupported(problems: list[tuple[str, str]]) -> None:
    if problems:
        param, message = problems[0]
        raise APIError(400, message + ".", param=param, code="unsupported_parameter")


# Sampling fields that take generation_config defaults when the request leaves them unset.
_DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_fields(body: SamplingRequestFields, max_tokens: int | None,
                    logprobs: int | None, max_model_len: int,
                    defaults: dict[str, Any] | None = None,
                    prompt_logprobs: int | None = None) -> dict[str, Any]:
    """SamplingParams fields as a wire dict; max_tokens None means "the rest of the context".

    Fields the request leaves unset take `defaults` (the model's generation_config), then
    SamplingParams' own defaults."""
    if max_tokens is not None and max_tokens >= max_model_len:
        raise APIError(400, f"max_tokens={max_tokens} is too large: this model's maximum "
                       f"context length is {max_model_len} tokens (prompt included).",
                       param="max_tokens", code="context_length_exceeded")
    defaults = defaults or {}
    chosen = {}
    for name in _DEFAULTABLE:
        value = getattr(body, name)
        if value is None:
            value = defaults.get(name)
        if value is not None:
            chosen[name] = value
    if "top_k" in chosen:
        chosen["top_k"] = max(0, chosen["top_k"])  # OpenAI-style -1 and 0 both disable top-k
    structured = body.structured_outputs_spec()
    try:
        params = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else 1,
            seed=body.seed,
            stop=body.stop_strings(),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            min_tokens=body.min_tokens,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            include_stop_str_in_output=body.include_stop_str_in_output,
            skip_special_tokens=body.skip_special_tokens,
            spaces_between_special_tokens=body.spaces_between_special_tokens,
            allowed_token_ids=body.allowed_token_ids,
            bad_words=tuple(body.bad_words or ()),
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            **chosen,
        )
        if body.truncate_prompt_tokens is not None:  # out of the context's range: a 400 now
            tokens_to_keep(body.truncate_prompt_tokens, max_model_len, max_tokens)
    except ValueError as exc:
        raise APIError(400, str(exc) + ".", param=_named_field(str(exc), body),
                       code="invalid_value") from exc
    if structured is not None:
        field, spec = structured
        try:
            params = dataclasses.replace(params, structured_outputs=StructuredOutputsParams(**spec))
        except (ValueError, TypeError) as exc:
            raise APIError(400, f"{field}: {exc}.", param=field,
                           code="invalid_structured_output") from exc
    if max_tokens is not None and body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({body.min_tokens}) must not exceed max_tokens "
                       f"({max_tokens}).", param="min_tokens", code="invalid_value")
    wire = sampling_to_wire(params)
    wire["max_tokens"] = max_tokens
    return wire


def _named_field(message: str, body: SamplingRequestFields) -> str | None:
    """The request field a SamplingParams error names first ("top_p must be ...")."""
    first = re.split(r"[ =]", message, maxsplit=1)[0]
    return first if first in type(body).model_fields else None


def check_prompt_size(prompt: EnginePrompt, max_model_len: int,
                      max_token_chars: int | None, truncating: bool = False) -> None:
    """400 for a prompt that cannot fit the context, decided without tokenizing it: token ids
    are counted, a text is measured against the longest token (`max_token_chars`), so an
    oversized prompt never reaches the engine. Not with truncate_prompt_tokens (`truncating`):
    a long prompt is then what the client asks the engine to cut."""
    if truncating:
        return
    too_long = (f"This model's maximum context length is {max_model_len} tokens. However, the "
                "prompt has {what}, which leaves no room for a completion.")
    if prompt.token_ids is not None and len(prompt.token_ids) >= max_model_len:
        raise APIError(400, too_long.format(what=f"{len(prompt.token_ids)} tokens"),
                       param="prompt", code="context_length_exceeded")
    if not max_token_chars:
        return
    if prompt.text is not None:
        num_chars, param = len(prompt.text), "prompt"
    elif prompt.chat_messages is not None:
        num_chars = sum(len(m.get("content") or "") for m in prompt.chat_messages)
        param = "messages"
    else:
        return
    if num_chars > max_model_len * max_token_chars:
        raise APIError(400, too_long.format(
            what=f"{num_chars} characters (no token is longer than {max_token_chars})"),
            param=param, code="context_length_exceeded")


def completion_prompts(body: CompletionRequest) -> list[EnginePrompt]:
    """One EnginePrompt per prompt of the (possibly batched) request."""
    prompt = body.prompt
    batch = (prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list)
             else [prompt])
    if len(batch) > MAX_BATCH_PROMPTS:
        raise APIError(400, f"a batch of {len(batch)} prompts is too large (at most "
                       f"{MAX_BATCH_PROMPTS}).", param="prompt", code="invalid_value")
    return [_one_prompt(p) for p in batch]


def _one_prompt(prompt: Any) -> EnginePrompt:
    if isinstance(prompt, str):
        if prompt == "":
            raise APIError(400, "the prompt is empty.", param="prompt", code="empty_prompt")
        return EnginePrompt(text=prompt)
    if not prompt:
        raise APIError(400, "the prompt is empty (no token ids).", param="prompt",
                       code="empty_prompt")
    if any(t < 0 for t in prompt):
        raise APIError(400, "prompt token ids must be >= 0.", param="prompt",
                       code="invalid_token_id")
    return EnginePrompt(token_ids=list(prompt))


def message_text(content: Any, i: int) -> Any:
    """Message i's content as the template reads it: text parts joined (text_messages), a 400
    naming the message for any other part. Chat and /tokenize both read messages this way."""
    if not isinstance(content, list):
        return content
    try:
        return text_messages([{"content": content}])[0]["content"]
    except ValueError:
        raise APIError(400, "only text content parts are supported.",
                       param=f"messages.{i}.content", code="unsupported_parameter") from None


def chat_prompt(body: ChatCompletionRequest) -> EnginePrompt:
    messages = []
    for i, m in enumerate(body.messages):
        content = message_text(m.content, i)
        message: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [_template_tool_call(c) for c in m.tool_calls]
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning
        messages.append(message)
    return EnginePrompt(chat_messages=messages)


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant's tool call as chat templates read it: OpenAI's shape with `arguments` as
    a dict (the API sends JSON text; templates apply tojson / items() to it), as vLLM does."""
    import json

    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError(400, "a tool call needs a 'function' object with a 'name'.",
                       param="messages", code="invalid_value")
    function = dict(function)
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # left as text: the template shows what the client sent
    return {**call, "function": function}


def chat_logprobs_count(body: ChatCompletionRequest) -> int | None:
    if not body.logprobs:
        return None
    return body.top_logprobs or 0
