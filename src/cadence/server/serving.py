"""The flow every OpenAI generation endpoint shares: map, admit, then stream or collect.

    handler -> serve_generation(request, body, prompts, ..., renderer)
               checks (model, unsupported features), sampling fields, admission of choice 0
               of every prompt (errors come back before any output)
               stream=true:  SSE events of all choices, merged as they come, closed on any exit
               stream=false: every choice to its end, one JSON body

A request has len(prompts) * n choices (choice index = prompt index * n + i, as OpenAI). Each
choice is one engine request. Choices 1..n-1 of a prompt are submitted once choice 0 produced
its first token: its prompt blocks are then in the prefix cache, so they are computed once.

Endpoints differ only in how they render outputs: a ResponseRenderer per endpoint (chat,
completions) builds the OpenAI chunks and the whole response. Errors, engine death, usage and
[DONE] are handled here once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from cadence.engine.async_client import EngineDeadError, RequestStream
from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.errors import APIError
from cadence.server.generation import (
    DISCONNECT_POLL_S,
    AbortOnCloseStreamingResponse,
    CollectedGeneration,
    created_timestamp,
    engine_dead_body,
    new_request_id,
    stream_error_body,
    submit,
)
from cadence.server.protocol import SamplingRequestFields
from cadence.server.request_mapping import (
    EnginePrompt,
    check_model,
    check_prompt_size,
    reject_unsupported,
    sampling_fields,
)
from cadence.server.sse import DONE_EVENT, SSE_HEADERS, SSE_MEDIA_TYPE, sse_event

Body = TypeVar("Body", bound=SamplingRequestFields)

logger = logging.getLogger("cadence.server")


@dataclass(frozen=True)
class ResponseContext:
    """What every chunk of one response repeats, and what the client asked to be shown."""

    req_id: str
    created: int
    model: str
    include_usage: bool
    want_logprobs: bool
    # Text put before each choice's output (completions echo=true), by choice index.
    echo: dict[int, str] = dataclasses.field(default_factory=dict)
    # stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far.
    continuous_usage: bool = False
    # vLLM's return_token_ids: generated ids on every choice, and the prompt's ids (by choice
    # index) where the endpoint puts them (server/token_ids.py).
    return_token_ids: bool = False
    prompt_token_ids: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>".
    tokens_as_ids: bool = False
    # Prompt logprobs by prompt index (choice index // n), filled as choice 0 of each prompt
    # brings them (the mux's live dict: its siblings are rendered after that output).
    prompt_scores: dict[int, tuple] = dataclasses.field(default_factory=dict)
    n: int = 1
    # Completions echo with max_tokens=0: the generated token is not shown.
    echo_only: bool = False

    def prompt_scores_of(self, index: int) -> tuple | None:
        return self.prompt_scores.get(index // self.n)


class ResponseRenderer(Protocol):
    """One endpoint's OpenAI format for one response. A fresh renderer serves each request,
    so it may keep state across chunks (e.g. text offsets per choice)."""

    # The "object" of this endpoint's stream chunks (the include_usage chunk repeats it).
    chunk_object: str
    # Optional (read with getattr): `frame_event(chunk) -> str`, the SSE framing of a chunk
    # (default sse_event: data only), and `stream_end: str`, what closes the stream (default
    # [DONE]); the Responses API names each event and sends no [DONE].

    def opening_chunks(self, index: int) -> list[dict[str, Any]]:
        """Chunks sent for choice `index` before any of its output."""
        ...

    def output_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        """Chunks for one engine output of choice `index` (never finish_reason "error")."""
        ...

    def whole_response(self, results: list[CollectedGeneration],
                       usage: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming response body (results in choice order)."""
        ...


@dataclass(frozen=True)
class ChoicePlan:
    """What to submit for every choice of one HTTP request."""

    prompts: list[EnginePrompt]
    n: int
    sampling: dict[str, Any]
    priority: int
    arrival: float
    submit_kwargs: dict[str, Any]

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def sampling_of(self, i: int) -> dict[str, Any]:
        """Completion i of n: a seeded request gets seed + i, so completions differ; prompt
        logprobs are completion 0's (the others then take its prefix blocks)."""
        if i == 0:
            return self.sampling
        sampling = {**self.sampling, "prompt_logprobs": None}
        if sampling.get("seed") is not None:
            sampling["seed"] += i
        return sampling


class ChoiceMux:
    """The engine streams of all choices of one request, merged into one event sequence."""

    def __init__(self, client: Any, req_id: str, plan: ChoicePlan) -> None:
        self._client = client
        self._req_id = req_id
        self._plan = plan
        self._streams: dict[int, RequestStream] = {}
        self._tasks: list[asyncio.Task] = []
        # (choice index, RequestOutput | exception | None = that choice is done)
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.prompt_tokens: dict[int, int] = {}
        self.prompt_texts: dict[int, str | None] = {}
        self.prompt_token_ids: dict[int, list[int] | None] = {}
        self.prompt_scores: dict[int, tuple] = {}  # prompt index -> its prompt logprobs

    async def _submit(self, index: int) -> RequestStream:
        plan = self._plan
        prompt_index, i = divmod(index, plan.n)
        suffix = "" if plan.num_choices == 1 else f"-{index}"
        stream = await submit(self._client, self._req_id + suffix, plan.prompts[prompt_index],
                              plan.sampling_of(i), plan.priority, plan.arrival,
                              **plan.submit_kwargs)
        self._streams[index] = stream
        if i == 0:
            self.prompt_tokens[prompt_index] = stream.num_prompt_tokens
            self.prompt_texts[prompt_index] = stream.prompt_text
            self.prompt_token_ids[prompt_index] = stream.prompt_token_ids
        return stream

    async def start(self) -> None:
        """Submit choice 0 of every prompt; an admission error closes what was opened."""
        try:
            for p in range(len(self._plan.prompts)):
                stream = await self._submit(p * self._plan.n)
                self._tasks.append(asyncio.create_task(self._pump(p * self._plan.n, stream)))
        except BaseException:
            self.close()
            raise

    async def _pump(self, index: int, stream: RequestStream) -> None:
        first = True
        try:
            async for out in stream:
                if out.prompt_logprobs is not None:
                    self.prompt_scores[index // self._plan.n] = out.prompt_logprobs
                self._queue.put_nowait((index, out))
                if first and index % self._plan.n == 0 and self._plan.n > 1:
                    await self._start_siblings(index)
                first = False
        except Exception as exc:  # engine death: the consumer decides what the client sees
            self._queue.put_nowait((index, exc))
            if first and index % self._plan.n == 0:
                for sibling in range(index + 1, index + self._plan.n):
                    self._queue.put_nowait((sibling, exc))
        finally:
            self._queue.put_nowait((index, None))

    async def _start_siblings(self, index: int) -> None:
        for sibling in range(index + 1, index + self._plan.n):
            try:
                stream = await self._submit(sibling)
            except Exception as exc:  # refused (e.g. 429 while we waited): that choice fails
                self._queue.put_nowait((sibling, exc))
                self._queue.put_nowait((sibling, None))
                continue
            self._tasks.append(asyncio.create_task(self._pump(sibling, stream)))

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """(choice index, RequestOutput or exception) until every choice is done."""
        remaining = self._plan.num_choices
        while remaining:
            index, item = await self._queue.get()
            if item is None:
                remaining -= 1
            else:
                yield index, item

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for stream in self._streams.values():
            stream.close()


async def serve_generation(
    request: Request,
    body: Body,
    *,
    id_prefix: str,
    prompts: list[EnginePrompt],
    max_tokens: int | None,
    logprobs: int | None,
    renderer: Callable[[ResponseContext], ResponseRenderer],
    submit_kwargs: dict[str, Any] | None = None,
    echo: Callable[[ChoiceMux], dict[int, str]] | None = None,
    prompt_logprobs: int | None = None,
    echo_only: bool = False,
) -> Response:
    """Validate `body`, admit it in the engine, answer with SSE events or one JSON body.

    `logprobs` is the number of alternatives asked for (None: no logprobs at all);
    `prompt_logprobs` those of each prompt token (None: not computed); `echo_only`: the
    prompt alone is shown (completions echo with max_tokens=0, run with max_tokens=1)."""
    arrival = time.monotonic()
    server = request.app.state.server
    check_model(body.model, server.model_name, server.model_names)
    reject_unsupported(body.unsupported_features())
    for prompt in prompts:
        check_prompt_size(prompt, server.max_model_len, server.max_token_chars,
                          truncating=body.truncate_prompt_tokens is not None)
    sampling = sampling_fields(body, 1 if echo_only else max_tokens, logprobs,
                               server.max_model_len, server.generation_defaults,
                               prompt_logprobs=prompt_logprobs)
    structured = body.structured_outputs_spec()
    req_id = new_request_id(id_prefix)
    if server.config.enable_log_requests:
        logger.info("request %s: %d prompt(s), n=%d, stream=%s, max_tokens=%s, sampling=%s",
                    req_id, len(prompts), body.n, body.stream, max_tokens,
                    {k: v for k, v in sampling.items() if v not in (None, (), [], False)})
    submit_kwargs = dict(submit_kwargs or {})
    if body.kv_transfer_params is not None:
        if body.n != 1 or len(prompts) != 1:
            raise APIError(400, "kv_transfer_params (disaggregated serving) takes one prompt "
                           "and n=1.", param="kv_transfer_params", code="unsupported_parameter")
        submit_kwargs["kv_transfer_params"] = body.kv_transfer_params
    if body.return_token_ids:
        submit_kwargs["want_prompt_token_ids"] = True
    if body.cache_salt is not None:
        submit_kwargs["cache_salt"] = body.cache_salt
    if body.truncation_side is not None:
        submit_kwargs["truncation_side"] = body.truncation_side
    plan = ChoicePlan(prompts, body.n, sampling, body.priority, arrival, submit_kwargs)
    mux = ChoiceMux(server.client, req_id, plan)
    try:
        await mux.start()
    except APIError as exc:
        if exc.code == "invalid_structured_output" and structured is not None:
            exc.param = structured[0]  # the engine cannot know which request field it was
        raise
    tokens_as_ids = body.return_tokens_as_token_ids
    # vLLM's: the client's id names the response (the engine's stays unique).
    client_id = request.headers.get("x-request-id") or body.request_id
    response_id = f"{id_prefix}-{client_id}" if client_id else req_id
    ctx = ResponseContext(response_id, created_timestamp(), server.model_name, body.include_usage(),
                          logprobs is not None, echo(mux) if echo else {},
                          continuous_usage=body.continuous_usage(),
                          return_token_ids=bool(body.return_token_ids),
                          prompt_token_ids={p * body.n + i: list(ids or ())
                                            for p, ids in mux.prompt_token_ids.items()
                                            for i in range(body.n)},
                          tokens_as_ids=(server.config.return_tokens_as_token_ids
                                         if tokens_as_ids is None else tokens_as_ids),
                          prompt_scores=mux.prompt_scores, n=body.n, echo_only=echo_only)
    render = renderer(ctx)
    if body.stream:
        return AbortOnCloseStreamingResponse(
            stream_events(mux, plan, ctx, render), on_close=mux.close,
            media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    results = await collect_all(request, mux, plan.num_choices)
    usage = fmt.usage_dict(sum(mux.prompt_tokens.values()),
                           sum(r.num_output_tokens for r in results),
                           cached_prompt_tokens(mux, plan, [r.num_cached_tokens for r in results]))
    response = render.whole_response(results, usage)
    if results[0].kv_transfer_params is not None:
        # A prefill worker's handoff (or a decode worker's transfer record), as vLLM answers.
        response["kv_transfer_params"] = results[0].kv_transfer_params
    return JSONResponse(response)


def cached_prompt_tokens(mux: ChoiceMux, plan: ChoicePlan, per_choice: list[int]) -> int:
    """usage.prompt_tokens_details.cached_tokens: prompt_tokens counts each prompt once (not
    once per choice), so its cached tokens are counted once too: the most any of its n choices
    found in the prefix cache, never more than the prompt."""
    total = 0
    for prompt_index, num_prompt in mux.prompt_tokens.items():
        choices = per_choice[prompt_index * plan.n:(prompt_index + 1) * plan.n]
        total += min(num_prompt, max(choices, default=0))
    return total


async def stream_events(mux: ChoiceMux, plan: ChoicePlan, ctx: ResponseContext,
                        render: ResponseRenderer) -> AsyncIterator[str]:
    """The SSE events of one streamed response, [DONE] last; closes the streams on any exit."""
    num_output: dict[int, int] = {}
    num_cached: dict[int, int] = {}

    # Optional on a renderer: completion_tokens_details() -> dict | None (chat with a
    # reasoning parser: the reasoning tokens so far).
    details = getattr(render, "completion_tokens_details", None)

    def usage_so_far() -> dict:
        usage = fmt.usage_dict(sum(mux.prompt_tokens.values()), sum(num_output.values()),
                               cached_prompt_tokens(mux, plan, [num_cached.get(i, 0) for i in
                                                                range(plan.num_choices)]))
        extra = details() if details is not None else None
        if extra is not None:
            usage["completion_tokens_details"] = extra
        return usage

    frame = getattr(render, "frame_event", sse_event)

    def event(chunk: dict) -> str:
        if ctx.continuous_usage:
            chunk["usage"] = usage_so_far()
        return frame(chunk)

    try:
        for index in range(plan.num_choices):
            for chunk in render.opening_chunks(index):
                yield event(chunk)
        async for index, out in mux.events():
            if isinstance(out, EngineDeadError):
                # The engine died mid-stream: say so in the stream instead of cutting it.
                yield sse_event(engine_dead_body(out))
                break
            if isinstance(out, APIError):
                yield sse_event(out.body())
                break
            if isinstance(out, BaseException):
                raise out
            num_output[index] = out.num_output_tokens
            num_cached[index] = out.num_cached_tokens
            if out.finish_reason == "error":
                yield sse_event(stream_error_body(out))
                break
            for chunk in render.output_chunks(out, index):
                yield event(chunk)
        if ctx.include_usage:
            yield sse_event(fmt.usage_chunk(ctx.req_id, ctx.created, ctx.model,
                                            render.chunk_object, usage_so_far()))
        yield getattr(render, "stream_end", DONE_EVENT)
    finally:
        mux.close()


async def _collect_into(mux: ChoiceMux, results: list[CollectedGeneration]) -> None:
    parts: list[list[str]] = [[] for _ in results]
    async for index, out in mux.events():
        if isinstance(out, BaseException):
            raise out
        result = results[index]
        parts[index].append(out.new_text)
        result.pieces.append((out.new_text, len(out.new_token_ids)))
        result.token_ids.extend(out.new_token_ids)
        if out.logprobs:
            result.logprobs.extend(out.logprobs)
        result.num_prompt_tokens = out.num_prompt_tokens
        result.num_output_tokens = out.num_output_tokens
        result.num_cached_tokens = out.num_cached_tokens
        if out.finished:
            result.finish_reason = out.finish_reason
            result.stop_reason = out.stop_reason
            result.error = out.error
            result.kv_transfer_params = out.kv_transfer_params
    for result, texts in zip(results, parts):
        result.text = "".join(texts)


async def collect_all(request: Request, mux: ChoiceMux,
                      num_choices: int) -> list[CollectedGeneration]:
    """Run every choice to the end; abort them all if the client goes away meanwhile."""
    results = [CollectedGeneration() for _ in range(num_choices)]
    task = asyncio.create_task(_collect_into(mux, results))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected", code="client_disconnected")
        task.result()
    except EngineDeadError as exc:
        raise APIError(503, f"The engine stopped: {exc}", code="engine_unavailable") from exc
    finally:
        if not task.done():
            task.cancel()
        mux.close()
    for result in results:
        if result.finish_reason == "error":
            raise APIError(500, f"generation failed: {result.error or 'engine error'}",
                           code="engine_error")
        if result.finish_reason == "abort":
            raise APIError(503, "the request was aborted (server shutting down).",
                           code="request_aborted")
    return results
