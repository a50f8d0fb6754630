"""Tool calls read from a reply while it streams, as vLLM streams them: a call's first delta
carries its id, type and function name as soon as the name is whole, later deltas carry pieces
of its arguments (JSON text) as the model writes them; text that is not a call streams as
content.

    stream = tool_stream("hermes")        # or llama3_json, pythonic; named_call / required_calls
    events = stream.feed(new_text)        # ToolEvent list: content / start / args
    events += stream.finish()             # at the end of the reply

Per format (the whole-reply readers in tool_parsers.py say what each looks like):
- hermes: content streams until `<tool_call>` (a possible start of the tag is held back); each
  block's JSON object streams as a call; text outside blocks after the first one is dropped,
  as the whole-reply reader drops it.
- llama3_json: a reply that starts with `{` (after `<|python_tag|>`) is held until its first
  key says whether it is a call; objects follow one another, separated by `;`.
- pythonic: a reply that starts with `[` is a list of calls; each call goes out (its name,
  then its arguments, read with `ast`, never evaluated) as soon as it closes.
A reply that turns out not to be calls before any call went out is sent as content; after a
call went out, what does not parse is dropped (a delta cannot be taken back).

JSON arguments are streamed as the model's own text, so the pieces of a call concatenate to
valid JSON. Scanning is incremental: each character is looked at once.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from cadence.server.tool_parsers import call_from_object

CONTENT, START, ARGS = "content", "start", "args"


@dataclass(frozen=True)
class ToolEvent:
    kind: str  # CONTENT (text), START (a call's index, id and name), ARGS (an arguments piece)
    text: str = ""
    index: int = 0
    name: str = ""
    call_id: str = ""

    def delta(self) -> dict[str, Any]:
        """The chat.completion.chunk delta (OpenAI's streamed tool_calls shape)."""
        if self.kind == CONTENT:
            return {"content": self.text}
        if self.kind == START:
            return {"tool_calls": [{"index": self.index, "id": self.call_id, "type": "function",
                                    "function": {"name": self.name, "arguments": ""}}]}
        return {"tool_calls": [{"index": self.index, "function": {"arguments": self.text}}]}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _ValueEnd:
    """Where a JSON value that starts at a given position ends, found incrementally (strings,
    escapes and nesting tracked across calls)."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False

    def scan(self, buf: str) -> int | None:
        """The end (exclusive) once the value is complete, else None (scanned up to len)."""
        while self.pos < len(buf):
            ch = buf[self.pos]
            self.pos += 1
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return self.pos
                continue
            if not self.started and ch.isspace():
                continue
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    return self.pos
            elif self.depth == 0 and ch in ",}] \n\t":
                return self.pos - 1  # a bare number / literal ended
        return None


# `{"name": "f", "arguments": ` (or "parameters"): the head of a call object, name whole.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                   r'\s*:\s*')


class _JsonCalls:
    """Calls written as JSON objects {"name": ..., "arguments"|"parameters": ...}, one after
    another with `separators` between them. Feeds on the text from the first object on."""

    def __init__(self, separators: str) -> None:
        self.separators = separators
        self.buf = ""
        self.pos = 0  # where the current object (or the gap before it) starts
        self.state = "between"  # between / head / args / tail / failed
        self.num_calls = 0
        self._args_start = 0
        self._args_sent = 0
        self._scanner: _ValueEnd | None = None
        self._object: _ValueEnd | None = None
        self._string_args = False

    def feed(self, text: str) -> list[ToolEvent]:
        self.buf += text
        events: list[ToolEvent] = []
        while True:
            before = (self.state, self.pos, self._args_sent)
            events += self._advance()
            if (self.state, self.pos, self._args_sent) == before:
                return events

    def _advance(self) -> list[ToolEvent]:
        buf = self.buf
        if self.state == "between":
            while self.pos < len(buf) and buf[self.pos] in self.separators:
                self.pos += 1
            if self.pos < len(buf):
                if buf[self.pos] != "{":
                    self.state = "failed"
                    return []
                self.state = "head"
                self._object = _ValueEnd(self.pos)
            return []
        if self.state == "head":
            match = _HEAD.match(buf, self.pos)
            if match is not None:
                name = json.loads(f'"{match.group(1)}"')
                self._args_start = self._args_sent = match.end()
                self._scanner = _ValueEnd(match.end())
                self._string_args = False
                self.state = "args"
                self.num_calls += 1
                return [ToolEvent(START, index=self.num_calls - 1, name=name,
                                  call_id=new_call_id())]
            end = self._object.scan(buf)
            if end is None:
                return []
            # A whole object that is not `{"name": ..., "arguments": ...}` in that order.
            try:
                obj = json.loads(buf[self.pos:end])
            except ValueError:
                obj = None
            call = call_from_object(obj, "parameters")
            if call is None:
                self.state = "failed"
                return []
            self.pos, self.state = end, "between"
            self.num_calls += 1
            return [ToolEvent(START, index=self.num_calls - 1, name=call.name,
                              call_id=new_call_id()),
                    ToolEvent(ARGS, call.arguments, index=self.num_calls - 1)]
        if self.state == "args":
            while self._args_start < len(buf) and buf[self._args_start].isspace():
                self._args_start += 1
            if self._args_start < len(buf) and buf[self._args_start] == '"':
                self._string_args = True  # arguments as JSON text: sent whole, decoded
            end = self._scanner.scan(buf)
            index = self.num_calls - 1
            if end is None:
                if self._string_args:
                    return []
                # Everything scanned so far belongs to the arguments.
                piece = buf[max(self._args_sent, self._args_start):self._scanner.pos]
                self._args_sent = self._scanner.pos
                return [ToolEvent(ARGS, piece, index=index)] if piece else []
            raw = buf[self._args_start:end]
            if self._string_args:
                try:
                    piece = json.dumps(json.loads(json.loads(raw)), ensure_ascii=False)
                except ValueError:
                    piece = "{}"
            else:
                piece = buf[max(self._args_sent, self._args_start):end]
            self._args_sent = end
            self._object = _ValueEnd(end)
            self._object.depth, self._object.started = 1, True  # inside the call object
            self.state = "tail"
            return [ToolEvent(ARGS, piece, index=index)] if piece else []
        if self.state == "tail":
            end = self._object.scan(buf)
            if end is not None:
                self.pos, self.state = end, "between"
            return []
        return []  # failed: the rest is ignored


class _Hermes:
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self.buf = ""
        self.pos = 0
        self.in_block = False
        self.seen_block = False
        self.calls: _JsonCalls | None = None
        self.num_calls = 0

    def feed(self, text: str) -> list[ToolEvent]:
        self.buf += text
        events: list[ToolEvent] = []
        while True:
            if not self.in_block:
                at = self.buf.find(self.OPEN, self.pos)
                if at == -1:
                    # Hold back a tail that may be the start of the tag.
                    keep = _prefix_tail(self.buf, self.pos, self.OPEN)
                    if not self.seen_block and len(self.buf) - keep > self.pos:
                        events.append(ToolEvent(CONTENT, self.buf[self.pos:len(self.buf) - keep]))
                    self.pos = len(self.buf) - keep
                    return events
                if not self.seen_block and at > self.pos:
                    events.append(ToolEvent(CONTENT, self.buf[self.pos:at]))
                self.seen_block = self.in_block = True
                self.pos = at + len(self.OPEN)
                self.calls = _JsonCalls(separators=" \n\t")
                continue
            close = self.buf.find(self.CLOSE, self.pos)
            # Short of a possible start of the closing tag, which the next pieces complete.
            end = (len(self.buf) - _prefix_tail(self.buf, self.pos, self.CLOSE) if close == -1
                   else close)
            for event in self.calls.feed(self.buf[self.pos:end]):
                events.append(_reindex(event, self.num_calls))
            self.pos = end
            if close == -1:
                return events
            self.num_calls += self.calls.num_calls
            self.in_block = False
            self.pos = close + len(self.CLOSE)

    def finish(self) -> list[ToolEvent]:
        if not self.in_block and not self.seen_block and self.pos < len(self.buf):
            return [ToolEvent(CONTENT, self.buf[self.pos:])]
        return []


def _reindex(event: ToolEvent, offset: int) -> ToolEvent:
    if event.kind == CONTENT or not offset:
        return event
    return ToolEvent(event.kind, event.text, event.index + offset, event.name, event.call_id)


def _prefix_tail(buf: str, start: int, tag: str) -> int:
    """Length of the longest tail of buf[start:] that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(buf) - start), 0, -1):
        if tag.startswith(buf[len(buf) - n:]):
            return n
    return 0


class _Leading:
    """A reply that is calls only if it starts with `opener` (after `prefix`): undecided until
    its first non-space character, content otherwise. The call text is held until the first
    call went out; if it fails before that, everything is content."""

    def __init__(self, prefix: str, opener: str) -> None:
        self.prefix, self.opener = prefix, opener
        self.buf = ""
        self.mode = "undecided"  # undecided / calls / content
        self.sent_content = 0

    def _body_start(self) -> int | None:
        """Where the calls' text starts, or None while undecided; -1: not calls."""
        stripped = self.buf.lstrip()
        if not stripped:
            return None
        if self.prefix and self.prefix.startswith(stripped) and stripped != self.prefix:
            return None
        offset = len(self.buf) - len(stripped)
        if self.prefix and stripped.startswith(self.prefix):
            rest = stripped[len(self.prefix):]
            if not rest.strip():
                return None
            offset += len(self.prefix) + len(rest) - len(rest.lstrip())
        return offset if self.buf[offset] == self.opener else -1

    def feed(self, text: str) -> list[ToolEvent]:
        self.buf += text
        if self.mode == "undecided":
            start = self._body_start()
            if start is None:
                return []
            if start == -1:
                self.mode = "content"
            else:
                self.mode = "calls"
                return self._call_events(self.buf[start:])
        if self.mode == "content":
            piece, self.sent_content = self.buf[self.sent_content:], len(self.buf)
            return [ToolEvent(CONTENT, piece)] if piece else []
        return self._call_events(text)

    def _call_events(self, text: str) -> list[ToolEvent]:
        events = self.calls_feed(text)
        if self.failed() and not self.num_calls():
            self.mode = "content"  # not calls after all: the whole reply is text
            piece, self.sent_content = self.buf, len(self.buf)
            return [ToolEvent(CONTENT, piece)]
        return events

    def finish(self) -> list[ToolEvent]:
        if self.mode == "calls" and self.num_calls() == 0 or self.mode == "undecided":
            piece = self.buf[self.sent_content:]
            return [ToolEvent(CONTENT, piece)] if piece else []
        return []

    # Per format.
    def calls_feed(self, text: str) -> list[ToolEvent]:
        raise NotImplementedError

    def failed(self) -> bool:
        raise NotImplementedError

    def num_calls(self) -> int:
        raise NotImplementedError


class _Llama3Json(_Leading):
    def __init__(self) -> None:
        super().__init__("<|python_tag|>", "{")
        self.calls = _JsonCalls(separators=" \n\t;")

    def calls_feed(self, text: str) -> list[ToolEvent]:
        return self.calls.feed(text)

    def failed(self) -> bool:
        return self.calls.state == "failed"

    def num_calls(self) -> int:
        return self.calls.num_calls


class _Pythonic(_Leading):
    """`[f(a=1), g()]`: elements split at top-level commas (strings and nesting tracked); a
    call goes out (its name, then its arguments) as soon as it closes."""

    def __init__(self) -> None:
        super().__init__("<|python_start|>", "[")
        self.text = ""
        self.pos = 0  # next character to scan
        self.depth = 0
        self.quote = ""
        self.escape = False
        self.element_start = 1  # after "["
        self.count = 0
        self.state = "list"  # list / done / failed

    def calls_feed(self, text: str) -> list[ToolEvent]:
        self.text += text
        events: list[ToolEvent] = []
        while self.pos < len(self.text) and self.state == "list":
            ch = self.text[self.pos]
            self.pos += 1
            if self.pos == 1:  # the opening "["
                self.depth = 1
                continue
            if self.quote:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == self.quote:
                    self.quote = ""
                continue
            if ch in "'\"":
                self.quote = ch
            elif ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth -= 1
            if self.depth == 1 and ch == "," or self.depth == 0 and ch == "]":
                if self.depth == 0:
                    self.state = "done"
                events += self._element(self.text[self.element_start:self.pos - 1])
                self.element_start = self.pos
        return events

    def _element(self, source: str) -> list[ToolEvent]:
        if not source.strip():
            return []  # "[]", or a trailing comma
        call = _python_call(source)
        if call is None:
            self.state = "failed"
            return []
        name, arguments = call
        self.count += 1
        return [ToolEvent(START, index=self.count - 1, name=name, call_id=new_call_id()),
                ToolEvent(ARGS, arguments, index=self.count - 1)]

    def failed(self) -> bool:
        return self.state == "failed"

    def num_calls(self) -> int:
        return self.count


def _python_call(source: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of `name(k=literal, ...)`, else None (never evaluated)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except ValueError:
        return None
    if None in args:
        return None
    return node.func.id, json.dumps(args, ensure_ascii=False)


class _Named:
    """tool_choice naming a function: the reply is that function's arguments (held to its
    parameters' JSON schema by the grammar), streamed as they come."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False

    def feed(self, text: str) -> list[ToolEvent]:
        events = []
        if not self.started:
            self.started = True
            events.append(ToolEvent(START, index=0, name=self.name, call_id=new_call_id()))
        if text:
            events.append(ToolEvent(ARGS, text, index=0))
        return events

    def finish(self) -> list[ToolEvent]:
        return self.feed("") if not self.started else []


class _Required:
    """tool_choice "required": the reply is a JSON array of {"name", "parameters"} objects
    (held to that shape by the grammar)."""

    def __init__(self) -> None:
        self.calls = _JsonCalls(separators=" \n\t[,]")

    def feed(self, text: str) -> list[ToolEvent]:
        return self.calls.feed(text)

    def finish(self) -> list[ToolEvent]:
        return []


STREAMING_PARSERS = {"hermes": _Hermes, "llama3_json": _Llama3Json, "pythonic": _Pythonic}


def tool_stream(parser: str) -> Any:
    """A fresh incremental reader for one reply in `parser`'s format."""
    return STREAMING_PARSERS[parser]()


def named_call_stream(name: str) -> _Named:
    return _Named(name)


def required_calls_stream() -> _Required:
    return _Required()
