"""What GET /tokenizer_info (vLLM's) tells a client about the served tokenizer.

lm-evaluation-harness's `local-completions` model, with no local tokenizer given, asks this
route for the special tokens (and the chat template) and then tokenizes through POST /tokenize,
so it scores exactly the ids the server's tokenizer makes. Built in the engine process (which
holds the tokenizer) and sent to the front end once, in EngineReady.
"""

from __future__ import annotations

from typing import Any


def tokenizer_info(tokenizer: Any, max_model_len: int) -> dict[str, Any]:
    """{tokenizer_class, eos_token, bos_token, pad_token, chat_template, model_max_length};
    empty when the engine has no tokenizer (token-id-only fakes)."""
    if tokenizer is None:
        return {}
    eos = getattr(tokenizer, "eos_token", None)
    return {
        "tokenizer_class": type(tokenizer).__name__,
        "eos_token": eos,
        "bos_token": getattr(tokenizer, "bos_token", None),
        # cadence pads nothing; vLLM's clients fall back to the EOS token for padding.
        "pad_token": eos,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "model_max_length": max_model_len,
    }
