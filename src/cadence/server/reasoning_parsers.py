"""Reasoning in a reply, in the formats vLLM's `--reasoning-parser` names.

A reasoning model writes its thinking first, then the answer; the parser splits the two so the
thinking goes to `reasoning` / `reasoning_content` and only the answer to `content` (where
tool calls are then read). Each name gives a `ReasoningFormat` for one request (some depend on
its chat template variables); `reasoning_stream.py` applies it to the text as it streams.

- deepseek_r1 (DeepSeek-R1 and its Qwen/Llama distills, QwQ, Phi-4-reasoning): reasoning is
  everything up to `</think>`; a leading `<think>` is dropped. Templates that open `<think>`
  in the prompt make the model write only the end tag, so a reply without any tag is all
  reasoning (cut inside its thinking).
- qwen3 (Qwen3, Qwen3.5): the same, except that `enable_thinking: false` (chat_template_kwargs,
  or reasoning_effort "none") makes a reply without a leading `<think>` all content.
- deepseek_v3 (DeepSeek-V3.1+ hybrid models): deepseek_r1 when `thinking` or `enable_thinking`
  is true in chat_template_kwargs, otherwise no reasoning at all (vLLM's default there).
- granite (IBM Granite 3.2+ with `thinking: true`): "Here is my thought process:" (or
  "Here's ...") opens the reasoning, "Here is my response:" (or "Here's ...") ends it; a reply
  that does not open with the first is all content.

A reply held to a grammar (response_format, guided_*, tool_choice "required" or a named
function) is constrained from its first token, so it cannot have started thinking in a
template-opened block: there, a reply without a leading start tag is content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REASONING, CONTENT = "reasoning", "content"


@dataclass(frozen=True)
class ReasoningFormat:
    """How one request's reply splits into reasoning and content."""

    # Tags that open the reasoning when the reply starts with one (after whitespace); several
    # spellings of the same tag are allowed. None of them may be a prefix of another.
    starts: tuple[str, ...]
    # Tags that end the reasoning; the text after the first one is content.
    ends: tuple[str, ...]
    # What a reply that does not open with a start tag is: REASONING (the template opened the
    # block in the prompt) or CONTENT.
    untagged: str

    def for_grammar(self) -> ReasoningFormat:
        """The format of a reply held to a grammar: untagged text is content."""
        return ReasoningFormat(self.starts, self.ends, CONTENT)


_THINK = ReasoningFormat(("<think>",), ("</think>",), REASONING)
_THINK_OPTIONAL = ReasoningFormat(("<think>",), ("</think>",), CONTENT)
_GRANITE = ReasoningFormat(("Here is my thought process:", "Here's my thought process:"),
                           ("Here is my response:", "Here's my response:"), CONTENT)


def _qwen3(template_kwargs: Mapping[str, Any]) -> ReasoningFormat:
    # Thinking is on unless the request turned it off (Qwen3's template default).
    return _THINK if template_kwargs.get("enable_thinking", True) is not False else _THINK_OPTIONAL


def _deepseek_v3(template_kwargs: Mapping[str, Any]) -> ReasoningFormat | None:
    thinking = bool(template_kwargs.get("thinking")) or bool(
        template_kwargs.get("enable_thinking"))
    return _THINK if thinking else None


# name -> the format for a request's chat template variables (None: no reasoning parsed).
REASONING_PARSERS: dict[str, Callable[[Mapping[str, Any]], ReasoningFormat | None]] = {
    "deepseek_r1": lambda kwargs: _THINK,
    "deepseek_v3": _deepseek_v3,
    "granite": lambda kwargs: _GRANITE,
    "qwen3": _qwen3,
}


def check_reasoning_parser(name: str) -> str:
    """`name` if cadence has that parser, else a ValueError listing the known ones."""
    if name not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"--reasoning-parser {name!r} is not one cadence has; it has: {known} "
                         "(vLLM's names; DeepSeek-R1 distills, QwQ and Phi-4-reasoning use "
                         "deepseek_r1)")
    return name


@dataclass(frozen=True)
class ReasoningMode:
    """One request's reasoning handling on a server with a reasoning parser."""

    format: ReasoningFormat | None  # None: the reply is all content (deepseek_v3 not thinking)
    # vLLM's include_reasoning: false drops the reasoning from the answer, and with it the
    # logprobs and token ids (which would show it), as vLLM does.
    include: bool = True


def reasoning_mode(parser: str | None, template_kwargs: Mapping[str, Any] | None,
                   grammar: bool = False, include: bool = True) -> ReasoningMode | None:
    """How one request's reply is split (None: the server has no reasoning parser).
    `grammar`: the reply is held to a grammar from its first token."""
    if parser is None:
        return None
    found = REASONING_PARSERS[parser](template_kwargs or {})
    if found is not None and grammar:
        found = found.for_grammar()
    return ReasoningMode(found, include)
