"""Tool calls out of a model's finished text, in the formats vLLM's `--tool-call-parser` names:

- hermes (Qwen 2.5/3, Hermes, many fine-tunes): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` blocks; the text before the first block is the message content.
- llama3_json (Llama 3.1+ JSON tool calls): the whole output is one JSON object
  `{"name": ..., "parameters": {...}}` (or several joined by ";"), optionally after
  `<|python_tag|>`.
- pythonic (Llama 3.2/4 style): the output is a Python list of calls,
  `[get_weather(city="Paris"), get_time()]`, read with `ast` (never evaluated).

Each parser returns (content, calls); text that is not a well-formed call stays content, so a
model that answers in prose is never turned into a broken call.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments

    def to_openai(self, index: int) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "index": index,
                "function": {"name": self.name, "arguments": self.arguments}}


def call_from_object(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models send the arguments already as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    calls = []
    for body in _HERMES.findall(text):
        try:
            call = call_from_object(json.loads(body), "arguments")
        except ValueError:
            call = None
        if call is None:
            return text, []  # a malformed block: leave the whole reply as text
        calls.append(call)
    if not calls:
        return text, []
    content = text[:text.index("<tool_call>")].strip()
    return content or None, calls


def parse_llama3_json(text: str) -> tuple[str | None, list[ToolCall]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except ValueError:
            return text, []
        call = call_from_object(obj, "parameters")
        if call is None:
            return text, []
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    return None, calls


def parse_pythonic(text: str) -> tuple[str | None, list[ToolCall]]:
    body = text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
    if not (body.startswith("[") and body.endswith("]")):
        return text, []
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError:
        return text, []
    if not isinstance(tree.body, ast.List):
        return text, []
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return text, []
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except ValueError:
            return text, []
        if None in args:  # **kwargs
            return text, []
        calls.append(ToolCall(node.func.id, json.dumps(args, ensure_ascii=False)))
    return (None, calls) if calls else (text, [])


TOOL_PARSERS = {"hermes": parse_hermes, "llama3_json": parse_llama3_json,
                "pythonic": parse_pythonic}
