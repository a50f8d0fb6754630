"""Admission of one request by the engine process: its prompt ids, its limits, back-pressure.

    prepare(engine, msg)      prompt ids (chat template, tokenizer), sampling checks and the
                              grammar's compilation; runs in the loop's admission threads,
                              never inside the step loop
    answer_tokenize(...)      /tokenize and /detokenize, in the same threads
    check_queue_limits(...)   back-pressure, on the loop thread when the request is added

Tokenization happens in the process that owns the tokenizer, so prompt-length errors come back
before the client's stream starts. A text longer than the context could hold even at the
vocabulary's longest token is refused before it is tokenized. Every refusal is an
AdmissionError carrying the HTTP status the front end answers (400 bad input, 429 busy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cadence.core.prompt_truncation import truncate_prompt
from cadence.core.sampling_params import SamplingParams
from cadence.engine.engine_core import EngineCore
from cadence.engine.wire import AddRequest, Tokenize, sampling_from_wire


# Sizes of the per-request lists whose setup (at admission) and per-step work grow with them;
# the front end refuses the same sizes first (server/protocol.py imports these).
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024  # OpenAI allows 300
MAX_TOKEN_ID_LIST = 1024  # stop_token_ids, bad_words (allowed_token_ids: the vocabulary)


@dataclass(frozen=True)
class AdmissionLimits:
    """Back-pressure: answer 429 past these many queued requests / queued prompt tokens."""

    max_num_queued_requests: int | None = None
    max_num_queued_tokens: int | None = None


class AdmissionError(Exception):
    """A request refused on admission, with the HTTP status the front end should answer."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def to_wire(self, req_id: str) -> dict[str, Any]:
        return {"req_id": req_id, "status": self.status, "message": self.message,
                "param": self.param, "code": self.code}


@dataclass(frozen=True)
class AdmittedRequest:
    """An AddRequest that passed every check: ready for EngineCore.add_request."""

    prompt_token_ids: list[int]
    params: SamplingParams
    # The request field that holds the prompt ("prompt" or "messages"), for error messages.
    prompt_param: str


def max_prompt_chars(engine: EngineCore) -> int | None:
    """Characters past which a text cannot fit the context: every token covers at most
    `max_token_chars` characters (None when the engine does not say)."""
    per_token = getattr(engine, "max_token_chars", None)
    return None if not per_token else engine.max_model_len * per_token


def check_text_length(engine: EngineCore, num_chars: int, param: str) -> None:
    """400 before tokenizing a text that is too long for the context whatever its tokens."""
    limit = max_prompt_chars(engine)
    if limit is not None and num_chars > limit:
        raise AdmissionError(
            400, f"This model's maximum context length is {engine.max_model_len} tokens and "
            f"no token is longer than {limit // engine.max_model_len} characters, so a prompt "
            f"of {num_chars} characters cannot fit.", param=param,
            code="context_length_exceeded")


def template_error(exc: Exception) -> AdmissionError:
    """The answer to a chat template that failed: a 400 naming `messages` (jinja errors, bad
    roles, a broken budget), or the status the renderer gives (503: no worker to render)."""
    status = getattr(exc, "status", 400)
    prefix = "chat template failed: " if status == 400 else ""
    return AdmissionError(status, f"{prefix}{exc}", param="messages" if status == 400 else None,
                          code=getattr(exc, "code", None) or "invalid_messages")


def prompt_token_ids(engine: EngineCore, msg: AddRequest) -> list[int]:
    """The prompt as token ids: given ids (checked against the vocabulary), rendered chat
    messages, or tokenized text. With truncate_prompt_tokens its length is checked once
    truncated (prepare), not here."""
    truncating = msg.sampling.get("truncate_prompt_tokens") is not None
    if msg.prompt_token_ids is not None:
        ids = list(msg.prompt_token_ids)
        if len(ids) >= engine.max_model_len and not truncating:
            raise AdmissionError(
                400, f"This model's maximum context length is {engine.max_model_len} tokens. "
                f"However, the prompt has {len(ids)} tokens, which leaves no room for a "
                "completion.", param="prompt", code="context_length_exceeded")
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            raise AdmissionError(
                400, f"prompt token id {bad[0]} is outside the vocabulary "
                f"[0, {engine.vocab_size})", param="prompt", code="invalid_token_id")
        return ids
    if msg.chat_messages is not None:
        try:
            extra = {}
            if (msg.chat_template is not None or msg.continue_final_message
                    or msg.chat_template_kwargs):
                extra = {"chat_template": msg.chat_template,
                         "continue_final_message": msg.continue_final_message,
                         "chat_template_kwargs": msg.chat_template_kwargs}
            text = engine.render_chat(msg.chat_messages, msg.add_generation_prompt, **extra)
        except Exception as exc:  # jinja errors, bad roles, budgets: the client's fault
            raise template_error(exc) from exc
        if not truncating:
            check_text_length(engine, len(text), "messages")
        # The template already wrote the special tokens (unless the client asks for more).
        return engine.tokenize(text, add_special_tokens=bool(msg.add_special_tokens))
    if not truncating:
        check_text_length(engine, len(msg.prompt_text or ""), "prompt")
    return engine.tokenize(msg.prompt_text or "",
                           add_special_tokens=msg.add_special_tokens is not False)


def _sampling_params(engine: EngineCore, msg: AddRequest, num_prompt: int) -> SamplingParams:
    """SamplingParams with max_tokens resolved against the context and the KV pool, its
    ranges checked against the model, and EOS ids filled in."""
    ctx = engine.max_model_len
    # Tokens the whole KV pool holds: a request needing more can never run to its end.
    pool = getattr(engine, "kv_capacity_tokens", None) or ctx
    sampling = dict(msg.sampling)
    if sampling.get("max_tokens") is None:
        sampling["max_tokens"] = min(ctx, pool) - num_prompt
        if sampling["max_tokens"] < 1:
            raise AdmissionError(
                400, f"the prompt has {num_prompt} tokens, but the KV cache holds only {pool} "
                "tokens in all, so no completion could follow it.", param=msg_param(msg),
                code="kv_cache_exceeded")
    elif num_prompt + sampling["max_tokens"] > ctx:
        raise AdmissionError(
            400, f"This model's maximum context length is {ctx} tokens. However, you "
            f"requested {num_prompt + sampling['max_tokens']} tokens ({num_prompt} in the "
            f"prompt, {sampling['max_tokens']} for the completion).", param="max_tokens",
            code="context_length_exceeded")
    elif num_prompt + sampling["max_tokens"] > pool:
        raise AdmissionError(
            400, f"The KV cache holds {pool} tokens in all; this request needs "
            f"{num_prompt + sampling['max_tokens']} ({num_prompt} in the prompt, "
            f"{sampling['max_tokens']} for the completion), so it could never finish. Lower "
            "max_tokens.", param="max_tokens", code="kv_cache_exceeded")
    if sampling.get("min_tokens", 0) > sampling["max_tokens"]:
        raise AdmissionError(
            400, f"min_tokens ({sampling['min_tokens']}) must not exceed max_tokens "
            f"({sampling['max_tokens']}, resolved against the context).", param="min_tokens",
            code="invalid_value")
    check_list_sizes(sampling, engine.vocab_size)
    for name in ("stop_token_ids", "allowed_token_ids"):
        bad = [t for t in sampling.get(name) or () if not 0 <= t < engine.vocab_size]
        if bad:
            raise AdmissionError(
                400, f"{name} holds {bad[0]}, outside the vocabulary "
                f"[0, {engine.vocab_size}).", param=name, code="invalid_token_id")
    # logit_bias on the wire: {"id": bias} (the front end's dict) or [[id, bias], ...].
    bias = sampling.get("logit_bias") or ()
    bias_ids = bias.keys() if isinstance(bias, dict) else [pair[0] for pair in bias]
    bad = [t for t in bias_ids if not (str(t).lstrip("-").isascii()
                                       and str(t).lstrip("-").isdigit()
                                       and 0 <= int(t) < engine.vocab_size)]
    if bad:
        raise AdmissionError(
            400, f"logit_bias names token id {bad[0]}, outside the vocabulary "
            f"[0, {engine.vocab_size}).", param="logit_bias", code="invalid_token_id")
    if not sampling.get("eos_token_ids"):
        sampling["eos_token_ids"] = list(engine.default_eos_token_ids())
    try:
        return sampling_from_wire(sampling)
    except (ValueError, TypeError) as exc:
        raise AdmissionError(400, str(exc), code="invalid_value") from exc


def check_list_sizes(sampling: dict[str, Any], vocab_size: int) -> None:
    """400 naming the field when a list whose setup grows with it is past its bound."""
    stop = sampling.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    limits = (("stop", len(stop), MAX_STOP_STRINGS),
              ("stop", max((len(s) for s in stop if isinstance(s, str)), default=0),
               MAX_STOP_CHARS),
              ("logit_bias", len(sampling.get("logit_bias") or ()), MAX_LOGIT_BIAS_ENTRIES),
              ("stop_token_ids", len(sampling.get("stop_token_ids") or ()), MAX_TOKEN_ID_LIST),
              ("bad_words", len(sampling.get("bad_words") or ()), MAX_TOKEN_ID_LIST),
              ("bad_words", max((len(w) for w in sampling.get("bad_words") or ()
                                 if isinstance(w, str)), default=0), MAX_STOP_CHARS),
              ("allowed_token_ids", len(sampling.get("allowed_token_ids") or ()), vocab_size))
    for name, size, limit in limits:
        if size > limit:
            raise AdmissionError(400, f"{name} is too large: {size} where at most {limit} "
                                 "are allowed (entries, or characters of one string).",
                                 param=name, code="invalid_value")


def msg_param(msg: AddRequest) -> str:
    """The request field that holds the prompt."""
    return "messages" if msg.chat_messages is not None else "prompt"


def check_queue_limits(limits: AdmissionLimits, num_queued: int, queued_tokens: int,
                       num_prompt: int) -> None:
    """429 when admitting `num_prompt` more prompt tokens would pass a limit."""
    max_req, max_tok = limits.max_num_queued_requests, limits.max_num_queued_tokens
    if max_req is not None and num_queued >= max_req:
        raise AdmissionError(429, f"server busy: {num_queued} requests already queued "
                             f"(limit {max_req}); retry later", code="queue_full")
    if max_tok is not None and queued_tokens + num_prompt > max_tok:
        raise AdmissionError(429, f"server busy: {queued_tokens} prompt tokens already "
                             f"queued, this request adds {num_prompt} (limit {max_tok}); "
                             "retry later", code="queue_full")


def prepare(engine: EngineCore, msg: AddRequest) -> AdmittedRequest:
    """Every admission check that needs no queue state, in the order the client should hear
    about them: the prompt, its length against the context, the sampling fields. Safe to run
    off the loop thread (it reads the engine's constants and its tokenizer only)."""
    ids = prompt_token_ids(engine, msg)
    ctx = engine.max_model_len
    if msg.sampling.get("truncate_prompt_tokens") is not None:
        msg, ids = _truncated(msg, ids, ctx)
    n = len(ids)
    param = msg_param(msg)
    if n == 0:
        raise AdmissionError(400, "the prompt is empty (0 tokens)", param=param,
                             code="empty_prompt")
    if n >= ctx:
        raise AdmissionError(
            400, f"This model's maximum context length is {ctx} tokens. However, the prompt "
            f"has {n} tokens, which leaves no room for a completion.", param=param,
            code="context_length_exceeded")
    params = _sampling_params(engine, msg, n)
    # The setup that grows with the request (stop-string matcher, bad words, token-edit
    # tensors, the grammar's compilation), here rather than on the step loop.
    setup = getattr(engine, "prepare_request", None)
    if setup is not None:
        try:
            params = setup(msg.req_id, params)
        except ValueError as exc:  # a grammar that does not compile (or past its budget), ...
            code = getattr(exc, "code", None)
            if code is None:
                field = next((f for f in ("bad_words", "stop") if f in str(exc)), None)
                raise AdmissionError(400, str(exc), param=field, code="invalid_value") from exc
            raise AdmissionError(400, str(exc), code=code) from exc
    return AdmittedRequest(ids, params, param)


def _truncated(msg: AddRequest, ids: list[int], ctx: int) -> tuple[AddRequest, list[int]]:
    """vLLM's truncate_prompt_tokens applied: the prompt's last k ids (first k with
    truncation_side "right"), and the message with
    the field cleared (the engine must not resolve it again once max_tokens is resolved)."""
    sampling = dict(msg.sampling)
    try:
        ids = truncate_prompt(ids, sampling.pop("truncate_prompt_tokens"), ctx,
                              sampling.get("max_tokens"), msg.truncation_side or "left")
    except ValueError as exc:
        raise AdmissionError(400, str(exc), param="truncate_prompt_tokens",
                             code="invalid_value") from exc
    return dataclasses.replace(msg, sampling=sampling), ids


def admit(engine: EngineCore, msg: AddRequest, limits: AdmissionLimits, num_queued: int,
          queued_tokens: int) -> AdmittedRequest:
    """prepare() then the queue limits, in one call (tests, in-thread use)."""
    admitted = prepare(engine, msg)
    check_queue_limits(limits, num_queued, queued_tokens, len(admitted.prompt_token_ids))
    return admitted


def answer_tokenize(engine: EngineCore, msg: Tokenize) -> dict[str, Any]:
    """{"tokens": [...]} or {"text": ...} for a Tokenize message; AdmissionError (a 400
    naming the field) on bad ids, a text too long for the context, a template failure."""
    if msg.token_ids is not None:
        if len(msg.token_ids) > engine.max_model_len:
            raise AdmissionError(400, f"{len(msg.token_ids)} token ids are more than the "
                                 f"context holds ({engine.max_model_len}).", param="tokens",
                                 code="context_length_exceeded")
        bad = [t for t in msg.token_ids if not (isinstance(t, int) and 0 <= t < engine.vocab_size)]
        if bad:
            raise AdmissionError(400, f"token id {bad[0]} is outside the vocabulary "
                                 f"[0, {engine.vocab_size})", param="tokens",
                                 code="invalid_token_id")
        detokenize = getattr(engine, "detokenize", None)
        text = (detokenize(msg.token_ids) if detokenize is not None
                else "".join(engine.token_text(t) for t in msg.token_ids))
        return {"text": text}
    if msg.messages is not None:
        try:
            # Only what is set: an engine without these options still renders plain chats.
            extra = {k: v for k, v in (("chat_template_kwargs", msg.chat_template_kwargs),
                                       ("chat_template", msg.chat_template),
                                       ("continue_final_message", msg.continue_final_message))
                     if v}
            text = engine.render_chat(msg.messages, msg.add_generation_prompt, **extra)
        except Exception as exc:  # jinja errors, bad roles, budgets: the client's fault
            raise template_error(exc) from exc
        check_text_length(engine, len(text), "messages")
        # The template writes the special tokens; add_special_tokens (vLLM's, default false
        # for a chat) adds the tokenizer's on top, as a chat completion does.
        tokens = list(engine.tokenize(text, add_special_tokens=msg.add_special_tokens))
    else:
        check_text_length(engine, len(msg.text or ""), "prompt")
        tokens = list(engine.tokenize(msg.text or "", add_special_tokens=msg.add_special_tokens))
    if not msg.return_token_strs:
        return {"tokens": tokens}
    pieces = getattr(engine, "token_pieces", None)
    return {"tokens": tokens, "token_strs": (pieces(tokens) if pieces is not None
                                             else [engine.token_text(t) for t in tokens])}
