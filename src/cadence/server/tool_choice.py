"""What a chat request's `tools` and `tool_choice` ask for, as vLLM serves them:

- "auto": the model may call tools; its reply is read with the server's --tool-call-parser
  (needs --enable-auto-tool-choice, as in vLLM).
- "none": the tools reach the chat template, the reply stays text.
- "required": the output is held by a grammar (structured output, llguidance) to a JSON array
  of one or more `{"name": <a tool's name>, "parameters": <its parameters>}` objects, each
  object held to its tool's parameters schema (exactly one with parallel_tool_calls=false);
  finish_reason "tool_calls".
- {"type": "function", "function": {"name": F}}: the output is held to F's parameters JSON
  schema and is F's arguments; finish_reason stays "stop" (vLLM's).
The last two need no parser: the grammar fixes the format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cadence.server.errors import APIError
from cadence.server.tool_parsers import TOOL_PARSERS, ToolCall, call_from_object
from cadence.server.tool_streaming import named_call_stream, required_calls_stream, tool_stream

# A reply's text -> (content, calls).
WholeReader = Callable[[str], tuple[str | None, list[ToolCall]]]


@dataclass(frozen=True)
class ToolMode:
    """How replies to one request are read for tool calls."""

    new_stream: Callable[[], Any]  # a fresh incremental reader (tool_streaming) per choice
    whole: WholeReader  # the reader of a finished reply
    # A reply with calls that ended "stop" is reported as "tool_calls" (auto, required).
    finish_as_tool_calls: bool


def _bad(message: str) -> APIError:
    return APIError(400, message, param="tool_choice", code="invalid_value")


def named_function(tool_choice: Any) -> str | None:
    """F of a {"type": "function", "function": {"name": F}} tool_choice, else None."""
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    if tool_choice.get("type") != "function" or not isinstance(function, dict) or \
            not isinstance(function.get("name"), str):
        raise _bad('a named tool_choice is {"type": "function", "function": {"name": ...}}.')
    return function["name"]


def tool_functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> parameters schema of each tool; a 400 naming `tools` for a malformed one."""
    out = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, 'each tool is {"type": "function", "function": {"name": ..., '
                           '"parameters": {...}}}.', param="tools", code="invalid_value")
        parameters = function.get("parameters") or {"type": "object"}
        if not isinstance(parameters, dict):
            raise APIError(400, f"tool {function['name']!r}: parameters must be a JSON "
                           "schema object.", param="tools", code="invalid_value")
        out[function["name"]] = parameters
    return out


def forced_schema(tools: list[dict[str, Any]] | None, tool_choice: Any,
                  single_call: bool = False) -> dict | None:
    """The JSON schema that "required" or a named function holds the output to (None for
    auto / none); APIError for a tool_choice that names no given tool. `single_call`
    (OpenAI's parallel_tool_calls=false): "required" makes exactly one call."""
    if tool_choice in (None, "auto", "none"):
        return None
    functions = tool_functions(tools)
    name = named_function(tool_choice)
    if name is not None:
        if name not in functions:
            raise _bad(f"tool_choice names {name!r}, which is not among the tools given.")
        return functions[name]
    if tool_choice != "required":
        raise _bad("tool_choice is 'none', 'auto', 'required' or a named function.")
    if not functions:
        raise APIError(400, "tool_choice 'required' needs tools.", param="tools",
                       code="invalid_value")
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [n]},
                                               "parameters": p},
              "required": ["name", "parameters"], "additionalProperties": False}
             for n, p in functions.items()]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return {**schema, "maxItems": 1} if single_call else schema


def _read_named(name: str) -> WholeReader:
    def read(text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            arguments = json.loads(text)
        except ValueError:
            return text, []  # cut by max_tokens: not a whole call
        return None, [ToolCall(name, json.dumps(arguments, ensure_ascii=False))]
    return read


def _read_required(text: str) -> tuple[str | None, list[ToolCall]]:
    try:
        items = json.loads(text)
    except ValueError:
        return text, []
    calls = [call_from_object(item, "parameters") for item in items]
    return (text, []) if not calls or None in calls else (None, calls)


def tool_mode(tools: list[dict[str, Any]] | None, tool_choice: Any,
              parser: str | None) -> ToolMode | None:
    """The reading of replies a request asks for (None: plain text); APIError when it asks
    for what this server does not do."""
    choice = "auto" if tool_choice is None else tool_choice
    if not tools:
        if choice not in ("auto", "none"):
            raise APIError(400, "tool_choice other than 'none' or 'auto' needs tools.",
                           param="tool_choice", code="invalid_value")
        return None
    # Every tool's shape, whatever tool_choice says (vLLM checks them as part of the body):
    # "none" and "auto" send them to the chat template too.
    tool_functions(tools)
    name = named_function(choice)
    if name is not None:
        return ToolMode(lambda: named_call_stream(name), _read_named(name), False)
    if choice == "required":
        return ToolMode(required_calls_stream, _read_required, True)
    if choice == "none":
        return None
    if choice != "auto":
        raise _bad("tool_choice is 'none', 'auto', 'required' or a named function.")
    if parser is None:
        raise APIError(400, "tool_choice 'auto' needs the server started with "
                       "--enable-auto-tool-choice --tool-call-parser "
                       f"{{{','.join(sorted(TOOL_PARSERS))}}} ('required' or a named "
                       "function work without them).", param="tools",
                       code="unsupported_parameter")
    return ToolMode(lambda: tool_stream(parser), TOOL_PARSERS[parser], True)
