"""A /v1/responses request -> the ChatCompletionRequest the chat path serves.

    instructions            -> a system message first
    input (text)            -> one user message
    input items             -> messages: role items (content as text or input_text /
                               output_text parts), function_call items -> an assistant turn's
                               tool_calls, function_call_output -> a tool message
    max_output_tokens       -> max_tokens
    text.format             -> response_format (json_object / json_schema)
    tools (flat functions)  -> chat tools {"type": "function", "function": {...}}
    tool_choice {"type": "function", "name": F} -> {"type": "function", "function": {"name": F}}
    reasoning.effort        -> reasoning_effort (a chat template variable)
    reasoning items         -> the reasoning of the assistant turn that follows them (the
                               template sees it as `reasoning` / `reasoning_content`)

Anything the chat path cannot take (images, built-in tools) is a 400 naming where it is in
the request.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cadence.server.errors import APIError
from cadence.server.protocol import ChatCompletionRequest
from cadence.server.protocol_responses import ResponsesRequest

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
# Chat request fields that keep their name and meaning on /v1/responses.
_SHARED_FIELDS = ("model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "seed", "stop", "ignore_eos", "priority", "cache_salt", "request_id",
                  "chat_template_kwargs", "stream")
# Chat field -> the /v1/responses field a chat-path error should name instead.
RESPONSES_PARAM = {"max_tokens": "max_output_tokens", "max_completion_tokens":
                   "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _text_of(content: Any, param: str) -> str | list[dict[str, str]]:
    """A message item's content as chat content: a string, or text parts (joined by the chat
    path exactly as chat content parts are)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, "content must be a string or a list of input_text / output_text "
                   "parts.")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise APIError(400, f"content part type {kind!r} is not supported (only "
                           "input_text and output_text: cadence serves text-only models).",
                           param=f"{param}.{j}.type", code="unsupported_parameter")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{param}.{j}.text", "a text part needs a 'text' string.")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _string_field(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _bad(f"{param}.{name}", f"{name} must be a string.")
    return value


def append_tool_call(messages: list[dict[str, Any]], call_id: str, name: str,
                     arguments: str) -> None:
    """A function_call item as a chat turn's tool call: consecutive calls are one assistant
    turn's calls (as a chat client sends them)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of the request's `input`."""
    if isinstance(items, str):
        if not items:
            raise APIError(400, "input is empty.", param="input", code="empty_prompt")
        return [{"role": "user", "content": items}]
    if not items:
        raise APIError(400, "input is an empty list.", param="input", code="empty_prompt")
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        param = f"input.{i}"
        if not isinstance(item, dict):
            raise _bad(param, "each input item must be an object.")
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = (reasoning or "") + reasoning_text(item, param)
            continue
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{param}.role", f"role must be one of {', '.join(_ROLES)}; got "
                           f"{role!r}.")
            messages.append({"role": role, "content": _text_of(item.get("content"),
                                                               f"{param}.content")})
        elif kind == "function_call":
            append_tool_call(messages, _string_field(item, "call_id", param),
                             _string_field(item, "name", param),
                             _string_field(item, "arguments", param))
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _string_field(item, "call_id", param),
                             "content": _text_of(output, f"{param}.output")})
        else:
            raise APIError(400, f"input item type {kind!r} is not supported (message, "
                           "function_call, function_call_output and reasoning are).",
                           param=f"{param}.type", code="unsupported_parameter")
        reasoning = attach_reasoning(messages, reasoning)
    return messages


def reasoning_text(item: dict[str, Any], param: str) -> str:
    """The text of a reasoning item: its reasoning_text content (or, without one, its summary
    texts), as this server's reasoning items carry it."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict)
                                              and isinstance(p.get("text"), str)
                                              for p in parts):
        raise _bad(f"{param}.content", "a reasoning item's content is a list of "
                   "{\"type\": \"reasoning_text\", \"text\": ...} parts.")
    return "".join(p["text"] for p in parts)


def attach_reasoning(messages: list[dict[str, Any]], reasoning: str | None) -> None:
    """Give the reasoning of the items just before to the last message if it is an assistant
    turn (reasoning before anything else is dropped, as a template has no place for it)."""
    if reasoning is not None and messages and messages[-1]["role"] == "assistant":
        messages[-1]["reasoning"] = reasoning


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The Responses API's flat function tools in the chat shape; built-in tools are a 400."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise APIError(400, f"tool type {kind!r} is not supported: only function tools "
                           "(cadence runs no built-in tools).", param=f"tools.{i}.type",
                           code="unsupported_parameter")
        function = {"name": _string_field(tool, "name", f"tools.{i}")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise APIError(400, "tool_choice is 'none', 'auto', 'required' or {\"type\": "
                       "\"function\", \"name\": ...} (no built-in tools).",
                       param="tool_choice", code="unsupported_parameter")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format as the chat route's response_format (None: plain text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object",
                                                            "json_schema"):
        raise APIError(400, "text.format type must be 'text', 'json_object' or "
                       "'json_schema'.", param="text.format", code="invalid_value")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("text.format.schema", "json_schema needs a 'schema' object.")
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response",
                                                   "schema": schema,
                                                   "strict": fmt.get("strict")}}


def chat_body(body: ResponsesRequest, history: list[dict[str, Any]] | None = None,
              turn: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat request that serves `body`; `history`: the messages of the response named by
    previous_response_id (its input and output), put after the instructions; `turn`: body.input
    as chat messages when the caller mapped it already (input_messages)."""
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += history or []
    messages += input_messages(body.input) if turn is None else turn
    payload: dict[str, Any] = {name: getattr(body, name) for name in _SHARED_FIELDS
                               if getattr(body, name) is not None}
    payload["messages"] = messages
    if body.max_output_tokens is not None:
        payload["max_tokens"] = body.max_output_tokens
    tools = chat_tools(body.tools)
    if tools:
        payload["tools"] = tools
    if body.tool_choice is not None:
        payload["tool_choice"] = chat_tool_choice(body.tool_choice)
    if body.parallel_tool_calls is not None:
        payload["parallel_tool_calls"] = body.parallel_tool_calls
    if (body.reasoning or {}).get("effort") is not None:
        payload["reasoning_effort"] = body.reasoning["effort"]
    rf = response_format(body.text)
    if rf is not None:
        payload["response_format"] = rf
    try:
        return ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise APIError(400, f"Invalid request: {where}: {first.get('msg')}.",
                       param=RESPONSES_PARAM.get(where.split(".")[0], "input"),
                       code="invalid_value") from None
