"""The engine process's wire format: typed messages as JSON objects, never pickled objects.

Both sides of the ZeroMQ PUSH/PULL pairs speak it (the front end binds, the engine connects):

    front end -> engine   add | abort | stats | tokenize | shutdown
    engine -> front end   ready (once, after loading) | batch (once per loop turn) | fatal
                          | heartbeat (stats every 0.5 s, from a side thread, even mid-step)

Every message is a dataclass below plus a "type" tag. Engine outputs travel as plain dicts
(`output_to_wire`) and come back as the engine's own RequestOutput (`output_from_wire`), whose
logprobs entries are then TokenLogprob: a SampledToken that also carries the token texts.
Nothing here imports torch: the front end imports this module.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cadence.core.plan import SampledToken
from cadence.core.sampling_params import SamplingParams
from cadence.engine.outputs import RequestOutput

# ---- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    """Admit one request. Exactly one of prompt_text / prompt_token_ids / chat_messages is set.

    `sampling` holds SamplingParams fields; its max_tokens may be None: the rest of the context.
    """

    req_id: str
    sampling: dict[str, Any]
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    chat_messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    priority: int = 0
    # time.monotonic() of the front end when the HTTP request arrived: CLOCK_MONOTONIC is
    # system-wide, so the engine's timelines (same clock) include the front end's share.
    arrival_time: float | None = None
    want_prompt_text: bool = False
    # vLLM's return_token_ids: the admission record carries the prompt's token ids (as the
    # engine runs them: templated, tokenized, truncated).
    want_prompt_token_ids: bool = False
    # vLLM's add_special_tokens: whether the tokenizer adds BOS etc. to the prompt's text
    # (None: True for a text, False for a chat, whose template writes them).
    add_special_tokens: bool | None = None
    # vLLM's truncation_side for sampling["truncate_prompt_tokens"]: "left" (None) keeps the
    # prompt's last k tokens, "right" its first k.
    truncation_side: str | None = None
    # vLLM's cache_salt: the request's prefix-cache blocks are shared only with requests of
    # the same salt (core/block_hash.py).
    cache_salt: str | None = None
    # Disaggregated serving: {"do_remote_decode": true} on a prefill worker, the prefill's
    # handoff ({"do_remote_prefill": true, ...}) on a decode worker (cadence.disagg).
    kv_transfer_params: dict[str, Any] | None = None
    # Per-request chat formatting (vLLM's chat_template / continue_final_message fields).
    chat_template: str | None = None
    continue_final_message: bool = False
    # Extra template variables (vLLM's chat_template_kwargs, e.g. Qwen3's enable_thinking).
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class AbortRequests:
    """Abort requests (client gone, shutdown). With `all_requests`, every live one."""

    req_ids: list[str] = field(default_factory=list)
    # Why, for the engine's log; clients always see finish_reason "abort".
    reason: str = "abort"
    all_requests: bool = False


@dataclass(frozen=True)
class GetStats:
    """Ask for a fresh stats snapshot; answered in the next batch's `stats_replies`."""

    nonce: int


@dataclass(frozen=True)
class Tokenize:
    """Tokenize text or a chat (`token_ids` None), or detokenize `token_ids`; answered in the
    next batch's `tokenize_replies` as {nonce, tokens | text | error}."""

    nonce: int
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    # The tokenizer's special tokens around `text` or the rendered `messages` (the front end
    # sends vLLM's defaults: True for a text, False for a chat).
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # for `messages`, as AddRequest's
    chat_template: str | None = None  # for `messages`: the request's own template
    continue_final_message: bool = False  # for `messages`: the last one left open
    # vLLM's: the tokens' vocabulary pieces too (reply "token_strs").
    return_token_strs: bool = False


@dataclass(frozen=True)
class Shutdown:
    """Abort everything still live (finish_reason "abort"), send the final batch, exit."""

    reason: str = "shutdown"  # for the engine's log


@dataclass(frozen=True)
class EngineReady:
    model_name: str
    max_model_len: int
    vocab_size: int
    pid: int
    stats: dict[str, Any]
    # The most characters one token covers (None: unknown); the front end refuses longer
    # prompt texts than max_model_len * max_token_chars without sending them.
    max_token_chars: int | None = None
    # Sampling defaults from the model's generation_config (--generation-config).
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # What is being served (model, dtype, device, KV cache, kernels, policy): the startup log.
    summary: dict[str, Any] = field(default_factory=dict)
    # The tokenizer's special tokens and chat template, for GET /tokenizer_info (vLLM's): a
    # client (lm-evaluation-harness's remote tokenizer) tokenizes with the server's tokenizer.
    tokenizer_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineBatch:
    """Everything one loop turn produced (filled in during the turn, hence not frozen).

    accepted: [{req_id, num_prompt_tokens, prompt_text}]; rejected: [{req_id, status, message,
    param, code}]; outputs: wire outputs (see `output_to_wire`); finished: finished-request
    telemetry records (see `timeline_record`); iteration: [num_steps, num_prefill_tokens,
    num_decode_tokens] of the steps run; stats: scheduler stats after this turn.
    """

    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    iteration: list[int] | None = None
    stats: dict[str, Any] | None = None
    stats_replies: list[int] = field(default_factory=list)
    # The turn's steps (see `step_record`), for attribution and the dashboard.
    steps: list[dict[str, Any]] = field(default_factory=list)
    tokenize_replies: list[dict[str, Any]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.accepted or self.rejected or self.outputs or self.finished
                    or self.stats_replies or self.iteration or self.steps
                    or self.tokenize_replies)


@dataclass(frozen=True)
class EngineHeartbeat:
    """Scheduler stats sent every STATS_INTERVAL_S from a side thread of the engine process,
    so gauges stay fresh while one long step runs (batches only go out between steps)."""

    stats: dict[str, Any]


@dataclass(frozen=True)
class EngineFatal:
    message: str


_MESSAGE_TYPES: Mapping[str, type] = MappingProxyType({
    "add": AddRequest,
    "abort": AbortRequests,
    "stats": GetStats,
    "tokenize": Tokenize,
    "shutdown": Shutdown,
    "ready": EngineReady,
    "batch": EngineBatch,
    "heartbeat": EngineHeartbeat,
    "fatal": EngineFatal,
})
_TYPE_NAMES: Mapping[type, str] = MappingProxyType({v: k for k, v in _MESSAGE_TYPES.items()})


class WireError(ValueError):
    """A message that is not valid JSON or not one of the known message types."""


def encode_message(msg: Any) -> bytes:
    """JSON in UTF-8; never fails on text: a lone surrogate (valid in a JSON string, not in
    UTF-8) crosses as its surrogatepass bytes and comes back as the same str."""
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    body["type"] = _TYPE_NAMES[type(msg)]
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def decode_message(data: bytes) -> Any:
    try:
        body = json.loads(data.decode("utf-8", "surrogatepass"))
        cls = _MESSAGE_TYPES[body.pop("type")]
        return cls(**body)
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"bad engine message: {exc}") from exc


# ---- sampling parameters ----------------------------------------------------------------------

_TUPLE_FIELDS = tuple(
    f.name for f in dataclasses.fields(SamplingParams) if str(f.type).startswith("tuple")
)


def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams as JSON-native data (tuples become lists)."""
    wire = {f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams)}
    if params.structured_outputs is not None:
        wire["structured_outputs"] = params.structured_outputs.to_dict()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in wire.items()}


def sampling_from_wire(data: Mapping[str, Any]) -> SamplingParams:
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown sampling fields: {sorted(unknown)}")
    kwargs = {k: (tuple(v) if k in _TUPLE_FIELDS and v is not None else v) for k, v in data.items()}
    return SamplingParams(**kwargs)


# ---- outputs ----------------------------------------------------------------------------------


@dataclass(slots=True)  # as SampledToken (core/plan.py)
class TokenLogprob(SampledToken):
    """A sampled token as the front end receives it: SampledToken plus the token texts.

    `token` is the sampled token's text; `top_tokens[i]` is the text of `top_logprobs[i]`.
    """

    token: str = ""
    top_tokens: tuple[str, ...] = ()

    @property
    def top(self) -> tuple[tuple[str, int, float], ...]:
        """The top alternatives as (text, token_id, logprob)."""
        return tuple((text, tid, lp) for text, (tid, lp) in zip(self.top_tokens, self.top_logprobs))


def logprobs_to_wire(logprobs: Any, token_ids: Sequence[int],
                     token_text: Callable[[int], str]) -> list[list[Any]] | None:
    """Per new token: [token_text, token_id, logprob, [[alt_text, alt_id, alt_logprob], ...]].

    Accepts a sequence of SampledToken-like entries (token_id, logprob, top_logprobs) or of
    plain floats, one per new token.
    """
    if not logprobs:
        return None
    wire = []
    for i, entry in enumerate(logprobs):
        tid = getattr(entry, "token_id", token_ids[i] if i < len(token_ids) else -1)
        lp = entry if isinstance(entry, int | float) else getattr(entry, "logprob", None)
        top = getattr(entry, "top_logprobs", ()) or ()
        wire.append([token_text(tid), tid, None if lp is None else float(lp),
                     [[token_text(a), a, float(b)] for a, b in top]])
    return wire


def logprobs_from_wire(wire: list[list[Any]] | None) -> tuple[TokenLogprob, ...] | None:
    if not wire:
        return None
    return tuple(
        TokenLogprob(token_id=tid, logprob=lp, top_logprobs=tuple((a, b) for _, a, b in top),
                     token=tok, top_tokens=tuple(text for text, _, _ in top))
        for tok, tid, lp, top in wire
    )


def prompt_logprobs_to_wire(scores: Any, token_text: Callable[[int], str]
                            ) -> list[list[Any]] | None:
    """Per prompt token: [text, token_id, logprob, rank, [[alt_text, alt_id, alt_logprob],
    ...]] (logprob and rank None for the first token, which nothing predicts)."""
    if not scores:
        return None
    return [[token_text(s.token_id), s.token_id, None if s.logprob is None else float(s.logprob),
             s.rank, [[token_text(a), a, float(b)] for a, b in s.top_logprobs]]
            for s in scores]


def prompt_logprobs_from_wire(wire: list[list[Any]] | None) -> tuple[TokenLogprob, ...] | None:
    if not wire:
        return None
    return tuple(
        TokenLogprob(token_id=tid, logprob=lp, rank=rank,
                     top_logprobs=tuple((a, b) for _, a, b in top),
                     token=tok, top_tokens=tuple(text for text, _, _ in top))
        for tok, tid, lp, rank, top in wire
    )


def output_to_wire(out: Any, token_text: Callable[[int], str]) -> dict[str, Any]:
    """RequestOutput-like object -> wire dict (the fields of RequestOutput, plain types)."""
    token_ids = [int(t) for t in out.new_token_ids]
    return {
        "req_id": out.req_id,
        "token_ids": token_ids,
        "text": out.new_text or "",
        "finished": bool(out.finished),
        "finish_reason": out.finish_reason,
        "num_prompt_tokens": int(out.num_prompt_tokens),
        "num_output_tokens": int(out.num_output_tokens),
        "num_cached_tokens": int(getattr(out, "num_cached_tokens", 0) or 0),
        "logprobs": logprobs_to_wire(getattr(out, "logprobs", None), token_ids, token_text),
        # Why a request ended with "error" (e.g. it can never fit the KV pool): reaches the client.
        "error": getattr(out, "error", None),
        "kv_transfer_params": getattr(out, "kv_transfer_params", None),
        "stop_reason": getattr(out, "stop_reason", None),
        "prompt_logprobs": prompt_logprobs_to_wire(getattr(out, "prompt_logprobs", None),
                                                   token_text),
    }


def output_from_wire(wire: Mapping[str, Any]) -> RequestOutput:
    """A wire dict back as the engine's RequestOutput (logprobs entries are TokenLogprob)."""
    return RequestOutput(
        req_id=wire["req_id"],
        new_token_ids=tuple(wire["token_ids"]),
        new_text=wire["text"],
        finished=wire["finished"],
        finish_reason=wire["finish_reason"],
        num_prompt_tokens=wire["num_prompt_tokens"],
        num_output_tokens=wire["num_output_tokens"],
        num_cached_tokens=wire.get("num_cached_tokens", 0),
        logprobs=logprobs_from_wire(wire.get("logprobs")),
        error=wire.get("error"),
        kv_transfer_params=wire.get("kv_transfer_params"),
        stop_reason=wire.get("stop_reason"),
        prompt_logprobs=prompt_logprobs_from_wire(wire.get("prompt_logprobs")),
    )


_STEP_FIELDS = (
    "step_id", "t_start", "t_end", "num_prefill_tokens", "num_decode_tokens", "num_seqs",
    "num_running", "num_waiting", "num_blocks_used", "num_blocks_total", "num_preemptions",
    "forward_time_s", "prefill_req_ids", "prefill_chunk_tokens", "prefill_prompt_tokens",
    "sampled_req_ids", "preempted_req_ids",
)


def step_record(record: Any) -> dict[str, Any]:
    """A cadence.telemetry StepRecord as a plain dict (engine-clock seconds; the ids of all
    chunks left out: sampled and prefill ids say what attribution and the dashboard need)."""
    out = {}
    for name in _STEP_FIELDS:
        value = getattr(record, name, None)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def timeline_record(timeline: Any) -> dict[str, Any]:
    """A finished cadence.telemetry RequestTimeline as a plain dict (engine-clock seconds)."""
    return {
        "req_id": timeline.req_id,
        "finish_reason": timeline.finish_reason or "abort",
        "num_prompt_tokens": int(timeline.num_prompt_tokens),
        "num_output_tokens": int(timeline.num_output_tokens),
        "num_cached_tokens": int(max(0, timeline.num_cached_tokens)),
        "num_preemptions": int(timeline.num_preemptions),
        "queue_time": timeline.queue_time,
        "prefill_time": timeline.prefill_time,
        "ttft": timeline.ttft,
        "e2e": timeline.e2e,
        "decode_time": timeline.decode_time,
        "tpot": timeline.tpot,
        "itl": list(timeline.itl),
    }
