"""Builders for OpenAI response objects (completions and chat, whole and streamed chunks).

Plain dicts, serialized once by the caller: cheaper than pydantic round trips on the hot
streaming path, and the shapes below are exactly OpenAI's.
"""

from __future__ import annotations

from typing import Any

from cadence.engine.wire import TokenLogprob


def usage_dict(num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int = 0) -> dict:
    usage: dict[str, Any] = {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
    }
    if num_cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
    return usage


def _envelope(req_id: str, obj: str, created: int, model: str,
              choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every OpenAI completion object and chunk starts with, in OpenAI's order."""
    return {"id": req_id, "object": obj, "created": created, "model": model, "choices": choices}


def _chunk(req_id: str, obj: str, created: int, model: str, choice: dict[str, Any],
           usage_field: bool, index: int = 0) -> dict[str, Any]:
    """One streamed chunk with a single choice.

    `usage_field`: with include_usage, OpenAI puts "usage": null on every other chunk."""
    chunk = _envelope(req_id, obj, created, model, [{"index": index, **choice}])
    if usage_field:
        chunk["usage"] = None
    return chunk


# ---- /v1/completions -------------------------------------------------------------------------


def completion_logprobs(entries: list[TokenLogprob], text_offset_start: int) -> dict[str, Any]:
    """Legacy completions logprobs: parallel lists, top_logprobs as {token: logprob} maps."""
    offsets = []
    offset = text_offset_start
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.logprob is None:  # an echoed prompt's first token: nothing predicts it
            tops.append(None)
            continue
        # Distinct tokens can share a text (e.g. partial UTF-8 bytes, shown as U+FFFD); the
        # legacy format is a {text: logprob} map, so the likeliest one keeps the key.
        top: dict[str, float] = {}
        for tok, _, lp in e.top:
            top.setdefault(tok, lp)
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def echoed_prompt_entries(scores: tuple[TokenLogprob, ...]) -> list[TokenLogprob]:
    """An echoed prompt's tokens as logprobs entries: each prompt token also among its
    alternatives (vLLM's echo shows the actual token beside the top N)."""
    entries = []
    for s in scores:
        if s.logprob is not None and all(t != s.token_id for t, _ in s.top_logprobs):
            s = TokenLogprob(token_id=s.token_id, logprob=s.logprob, rank=s.rank,
                             top_logprobs=(*s.top_logprobs, (s.token_id, s.logprob)),
                             token=s.token, top_tokens=(*s.top_tokens, s.token))
        entries.append(s)
    return entries


# vLLM's floor for logprobs in JSON (-inf is not JSON).
_MIN_LOGPROB = -9999.0


def prompt_logprobs_field(scores: tuple[TokenLogprob, ...] | None) -> list | None:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then {token_id: {logprob,
    rank, decoded_token}} holding the prompt token and its top alternatives (ranked 1..k)."""
    if scores is None:
        return None
    out: list[dict[str, Any] | None] = [None]
    for s in scores[1:]:
        entry = {str(s.token_id): {"logprob": max(s.logprob, _MIN_LOGPROB), "rank": s.rank,
                                   "decoded_token": s.token}}
        for k, (text, tid, lp) in enumerate(s.top):
            entry.setdefault(str(tid), {"logprob": max(lp, _MIN_LOGPROB), "rank": k + 1,
                                        "decoded_token": text})
        out.append(entry)
    return out


def completion_choice(text: str, finish_reason: str | None, logprobs: dict | None,
                      stop_reason: str | int | None = None,
                      prompt_logprobs: list | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason  # vLLM's field: the stop string or token id
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs  # vLLM's, per choice
    return choice


def completion_chunk(
    req_id: str, created: int, model: str, text: str, finish_reason: str | None,
    logprobs: dict | None = None, usage_field: bool = False, index: int = 0,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return _chunk(req_id, "text_completion", created, model,
                  completion_choice(text, finish_reason, logprobs, stop_reason),
                  usage_field, index)


def usage_chunk(req_id: str, created: int, model: str, obj: str, usage: dict) -> dict[str, Any]:
    """The final chunk of `stream_options.include_usage`: empty choices, the usage."""
    return {**_envelope(req_id, obj, created, model, []), "usage": usage}


def completion_response(req_id: str, created: int, model: str, choices: list[dict[str, Any]],
                        usage: dict) -> dict[str, Any]:
    """choices: completion_choice() dicts in index order."""
    body = _envelope(req_id, "text_completion", created, model,
                     [{"index": i, **c} for i, c in enumerate(choices)])
    body["usage"] = usage
    return body


# ---- /v1/chat/completions --------------------------------------------------------------------


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": _token_bytes(e.token),
                "top_logprobs": [
                    {"token": tok, "logprob": lp, "bytes": _token_bytes(tok)}
                    for tok, _, lp in e.top
                ],
            }
            for e in entries
        ]
    }


def chat_chunk(
    req_id: str, created: int, model: str, delta: dict, finish_reason: str | None,
    logprobs: dict | None = None, usage_field: bool = False, index: int = 0,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"delta": delta, "logprobs": logprobs,
                              "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    return _chunk(req_id, "chat.completion.chunk", created, model, choice, usage_field, index)


def chat_choice(text: str, finish_reason: str | None, logprobs: dict | None,
                stop_reason: str | int | None = None) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": stop_reason}


def chat_response(req_id: str, created: int, model: str, choices: list[dict[str, Any]],
                  usage: dict) -> dict[str, Any]:
    """choices: chat_choice() dicts in index order."""
    return {**_envelope(req_id, "chat.completion", created, model,
                        [{"index": i, **c} for i, c in enumerate(choices)]), "usage": usage}
