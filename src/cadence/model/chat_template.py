"""Chat templates: render a Jinja2 template (as shipped in GGUF / tokenizer_config.json) safely.

Templates come with downloaded model files, so they are untrusted code. Jinja's immutable
sandbox stops attribute tricks; `BoundedSandbox` adds budgets, one set per render: strings and
lists a template builds (`*`, `%`, `+`, method calls, filters), the output it writes, the loop
iterations `range` hands out, and wall time. Past one, rendering stops with a ValueError
(the server answers 400).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

# Budgets of one render. Real chat templates stay orders of magnitude below them.
MAX_VALUE_CHARS = 4 * 2**20  # any one string or list the template builds
MAX_OUTPUT_CHARS = 8 * 2**20  # the whole rendered prompt
MAX_LOOP_ITERATIONS = 1_000_000  # all range() iterations together
MAX_RENDER_SECONDS = 5.0


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_size(value: Any) -> Any:
    if _size(value) > MAX_VALUE_CHARS:
        raise SecurityError(f"the template built a value of {_size(value)} items "
                            f"(limit {MAX_VALUE_CHARS})")
    return value


def _check_int_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # A width, count or repeat argument this large can only build a huge value.
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_VALUE_CHARS:
            raise SecurityError(f"argument {arg} is too large for a chat template")


def _check_format_string(fmt: Any) -> None:
    # '%10000000000s' % x or '{:10000000000}'.format(x): the width lives in the format string.
    if isinstance(fmt, str) and any(int(n) > MAX_VALUE_CHARS for n in re.findall(r"\d+", fmt)):
        raise SecurityError("the template formats with a width past the size limit")


class _Budget:
    """Loop iterations and time left to one render."""

    def __init__(self) -> None:
        self.iterations = MAX_LOOP_ITERATIONS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS

    def tick(self, n: int = 1) -> None:
        self.iterations -= n
        if self.iterations < 0:
            raise SecurityError(f"the template ran more than {MAX_LOOP_ITERATIONS} loop "
                                "iterations")
        if time.monotonic() > self.deadline:
            raise SecurityError(f"the template ran longer than {MAX_RENDER_SECONDS:.0f}s")

    def range(self, *args: int) -> Iterator[int]:
        _check_int_args(args, {})
        for i in range(*args):
            self.tick()
            yield i


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with size checks on every operator, call and filter result."""

    intercepted_binops = frozenset(["*", "**", "%", "+", "//"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*" and (_size(left) or _size(right)):
            count = right if _size(left) else left
            if isinstance(count, int) and max(_size(left), _size(right)) * count > MAX_VALUE_CHARS:
                raise SecurityError("the template multiplies a value past the size limit")
        if operator == "**" and isinstance(right, int | float) and (
                abs(right) > 1024
                or (isinstance(left, int) and left.bit_length() * abs(right) > 65536)):
            raise SecurityError("the template raises to a power past the limit")
        if operator == "%" and isinstance(left, str):
            _check_format_string(left)
            _check_int_args(tuple(right) if isinstance(right, tuple) else (right,), {})
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_int_args(args, kwargs)
        if getattr(__obj, "__name__", None) in ("format", "format_map"):
            # The sandbox hands templates a wrapper of str.format; the string is its __self__.
            method = getattr(__obj, "__wrapped__", __obj)
            _check_format_string(getattr(method, "__self__", None))
        return _check_size(super().call(__context, __obj, *args, **kwargs))


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_int_args(args[1:], kwargs)
        if name == "format":
            for arg in args[:2]:  # the value, after the eval context jinja may pass first
                _check_format_string(arg)
        return _check_size(f(*args, **kwargs))

    # Keep jinja's pass_context / pass_environment markers.
    for marker in ("jinja_pass_arg",):
        if hasattr(f, marker):
            setattr(bounded, marker, getattr(f, marker))
    return bounded


def _raise_exception(message: str) -> None:
    # Templates call raise_exception("...") to reject bad conversations (e.g. roles out of order).
    raise ValueError(f"chat template rejected the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # transformers' tojson (plain json.dumps, non-ASCII kept), not jinja's HTML-safe one that
    # escapes <, >, & and ': tool schemas in Llama 3.1 / Qwen prompts must match token for token.
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"chat template: tojson cannot encode a {type(value).__name__}") from exc


class _GenerationBlock(Extension):
    """transformers' {% generation %} ... {% endgeneration %} (marks the assistant's text for
    training masks): rendering is the block's body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


# Variables the renderer sets itself; chat_template_kwargs cannot replace them.
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "range"})


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """chat_template_kwargs as a dict of extra template variables; ValueError if it is not a
    mapping of names or sets a variable the renderer owns."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("chat_template_kwargs must map variable names to values")
    clash = sorted(RESERVED_VARIABLES & kwargs.keys())
    if clash:
        raise ValueError(f"chat_template_kwargs cannot set {', '.join(clash)} (set by the server)")
    return dict(kwargs)


class ChatTemplate:
    """A compiled chat template, rendered the way Hugging Face transformers renders it.

    The environment is sandboxed (templates come with downloaded models) and uses the same
    whitespace rules as transformers (trim_blocks, lstrip_blocks), so prompts match token for token.
    """

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None):
        env = BoundedSandbox(
            trim_blocks=True, lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols", _GenerationBlock]
        )
        env.filters["tojson"] = _tojson
        env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from exc
        self.source = source
        self._bos_token = bos_token or ""
        self._eos_token = eos_token or ""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """Render the conversation to prompt text; raises ValueError for malformed messages."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"message {i} must be a dict with a 'role' key, got {message!r}")
        kwargs = check_template_kwargs(kwargs)
        budget = _Budget()
        parts: list[str] = []
        size = 0
        try:
            for part in self._template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
                **kwargs,
                range=budget.range,
            ):
                size += len(part)
                if size > MAX_OUTPUT_CHARS:
                    raise SecurityError(f"the template wrote more than {MAX_OUTPUT_CHARS} "
                                        "characters")
                budget.tick(0)
                parts.append(part)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed to render: {exc}") from exc
        except OverflowError as exc:
            raise ValueError(f"chat template failed to render: {type(exc).__name__}") from exc
        return "".join(parts)
