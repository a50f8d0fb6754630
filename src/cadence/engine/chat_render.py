"""A conversation as prompt text: the model's chat template (or one given per request), with
vLLM's add_generation_prompt / continue_final_message switches. The server's engine renders
in worker processes (`templates`, template_pool.py); offline use renders in-process."""

from __future__ import annotations

from typing import Any


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], chat_template: str | None,
                add_generation_prompt: bool, continue_final_message: bool,
                templates: Any = None) -> str:
    """The prompt text of a conversation. `continue_final_message` (vLLM's): the last
    (assistant) message is left open so the model continues it."""
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
                                add_generation_prompt)
    elif chat_template is not None:
        from cadence.model.chat_template import ChatTemplate

        template = ChatTemplate(chat_template, tokenizer.bos_token, tokenizer.eos_token)
        text = template.render(messages, add_generation_prompt=add_generation_prompt)
    else:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    if continue_final_message:
        final = messages[-1].get("content") or ""
        cut = text.rfind(final)
        if cut < 0:
            raise ValueError("the chat template does not reproduce the final message verbatim")
        text = text[: cut + len(final)]
    return text
