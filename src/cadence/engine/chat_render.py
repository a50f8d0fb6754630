"""A conversation as prompt text: the model's chat template (or one given per request), with
vLLM's add_generation_prompt / continue_final_message switches. The server's engine renders
in worker processes (`templates`, template_pool.py); offline use renders in-process."""

from __future__ import annotations

from typing import Any


def chat_template_kwargs_problem(kwargs: Any) -> str | None:
    """Why `chat_template_kwargs` cannot be used (None when it can), for request validation."""
    from cadence.model.chat_template import check_template_kwargs

    try:
        check_template_kwargs(kwargs)
    except ValueError as exc:
        return str(exc)
    return None


def text_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI messages with `content` as a list of {"type": "text", "text": ...} parts joined
    into one string (what chat templates read), one newline between parts as vLLM joins them
    for a string-content template; ValueError for any other part type."""
    if not isinstance(messages, list | tuple):
        raise ValueError("messages must be a list of {'role', 'content'} dicts")
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            texts = []
            for part in content:
                if (not isinstance(part, dict) or part.get("type") != "text"
                        or not isinstance(part.get("text"), str)):
                    raise ValueError(f"message {i}: only text content parts are supported")
                texts.append(part["text"])
            message = {**message, "content": "\n".join(texts)}
        out.append(message)
    return out


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], chat_template: str | None,
                add_generation_prompt: bool, continue_final_message: bool,
                templates: Any = None, template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of a conversation. `continue_final_message` (vLLM's): the last
    (assistant) message is left open so the model continues it. `template_kwargs` (vLLM's
    chat_template_kwargs): extra variables the template reads, e.g. Qwen3's enable_thinking."""
    from cadence.model.chat_template import check_template_kwargs

    kwargs = check_template_kwargs(template_kwargs)
    if continue_final_message:
        if add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("continue_final_message needs a final assistant message")
    if templates is not None:
        source = chat_template if chat_template is not None else tokenizer.chat_template
        if source is None:
            raise ValueError("this model has no chat template; use a plain completion prompt")
        text = templates.render(source, tokenizer.bos_token, tokenizer.eos_token, messages,
                                add_generation_prompt, **kwargs)
    elif chat_template is not None:
        from cadence.model.chat_template import ChatTemplate

        template = ChatTemplate(chat_template, tokenizer.bos_token, tokenizer.eos_token)
        text = template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    else:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                             **kwargs)
    if continue_final_message:
        final = messages[-1].get("content") or ""
        cut = text.rfind(final)
        if cut < 0:
            raise ValueError("the chat template does not reproduce the final message verbatim")
        text = text[: cut + len(final)]
    return text
