"""POST /v1/completions: whole responses and SSE streams in OpenAI's legacy completions format."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from cadence.engine.outputs import RequestOutput
from cadence.server import response_format as fmt
from cadence.server.generation import CollectedGeneration
from cadence.server.protocol import CompletionRequest
from cadence.server.request_mapping import completion_prompts
from cadence.server.serving import ChoiceMux, ResponseContext, serve_generation
from cadence.server.token_ids import PendingTokenIds, logprobs_as_token_ids


class CompletionRenderer:
    """Legacy completion chunks: text deltas per choice, the finish_reason on the last one.

    echo: the prompt's text comes first, in a chunk of its own before any output; with
    logprobs it waits for the first output, which brings the prompt's logprobs, and goes out
    with it (as vLLM streams it). echo with max_tokens=0 shows the prompt alone."""

    chunk_object = "text_completion"

    def __init__(self, ctx: ResponseContext) -> None:
        self.ctx = ctx
        # Characters streamed so far per choice: logprobs' text_offset counts from its start.
        self._text_offset: dict[int, int] = {}
        # return_token_ids: ids not yet sent per choice, and the choices whose prompt ids went.
        self._pending_ids = PendingTokenIds()
        self._sent_prompt: set[int] = set()
        # Choices whose echoed prompt waits for its logprobs.
        self._echo_pending: set[int] = set()

    def _with_token_ids(self, chunk: dict[str, Any], index: int) -> dict[str, Any]:
        """vLLM's stream: each chunk's new ids, the prompt's ids on a choice's first chunk."""
        if self.ctx.return_token_ids:
            choice = chunk["choices"][0]
            if index not in self._sent_prompt:
                self._sent_prompt.add(index)
                choice["prompt_token_ids"] = self.ctx.prompt_token_ids.get(index, [])
            choice["token_ids"] = self._pending_ids.take(index)
        return chunk

    def _logprobs(self, entries: list, offset: int) -> dict[str, Any]:
        if self.ctx.tokens_as_ids:
            entries = logprobs_as_token_ids(entries)
        return fmt.completion_logprobs(entries, offset)

    def opening_chunks(self, index: int) -> list[dict[str, Any]]:
        echo = self.ctx.echo.get(index)
        if not echo:
            return []
        if self.ctx.want_logprobs:
            self._echo_pending.add(index)
            return []
        self._text_offset[index] = len(echo)
        ctx = self.ctx
        return [self._with_token_ids(fmt.completion_chunk(
            ctx.req_id, ctx.created, ctx.model, echo, None, usage_field=ctx.include_usage,
            index=index), index)]

    def _echo_logprobs(self, index: int) -> list:
        scores = self.ctx.prompt_scores_of(index)
        return fmt.echoed_prompt_entries(scores) if scores else []

    def output_chunks(self, out: RequestOutput, index: int) -> list[dict[str, Any]]:
        ctx = self.ctx
        text = "" if ctx.echo_only else out.new_text
        entries = [] if ctx.echo_only or not out.logprobs else list(out.logprobs)
        offset = self._text_offset.get(index, 0)
        if index in self._echo_pending:
            self._echo_pending.discard(index)
            text = ctx.echo.get(index, "") + text
            entries = self._echo_logprobs(index) + entries
        logprobs = None
        if ctx.want_logprobs and entries:
            logprobs = self._logprobs(entries, offset)
            last = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            self._text_offset[index] = max(offset + len(text), last)
        else:
            self._text_offset[index] = offset + len(text)
        if not ctx.echo_only:
            self._pending_ids.add(index, out.new_token_ids)
        # Outputs that carry no text (a held-back stop-string prefix) send nothing until the
        # last one, which carries the finish_reason.
        if not (text or logprobs or out.finished):
            return []
        return [self._with_token_ids(fmt.completion_chunk(
            ctx.req_id, ctx.created, ctx.model, text,
            out.finish_reason if out.finished else None, logprobs,
            usage_field=ctx.include_usage, index=index, stop_reason=out.stop_reason), index)]

    def _choice(self, i: int, r: CollectedGeneration) -> dict[str, Any]:
        ctx = self.ctx
        echo = ctx.echo.get(i)
        text = "" if ctx.echo_only else r.text
        entries = [] if ctx.echo_only else list(r.logprobs)
        if echo is not None:
            text = echo + text
            if ctx.want_logprobs:
                entries = self._echo_logprobs(i) + entries
        logprobs = self._logprobs(entries, 0) if ctx.want_logprobs else None
        return fmt.completion_choice(text, r.finish_reason, logprobs, r.stop_reason,
                                     fmt.prompt_logprobs_field(ctx.prompt_scores_of(i)))

    def whole_response(self, results: list[CollectedGeneration],
                       usage: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        choices = [self._choice(i, r) for i, r in enumerate(results)]
        if ctx.return_token_ids:  # vLLM's: both on the choice
            for i, (choice, r) in enumerate(zip(choices, results)):
                choice["prompt_token_ids"] = ctx.prompt_token_ids.get(i, [])
                choice["token_ids"] = [] if ctx.echo_only else list(r.token_ids)
        return fmt.completion_response(ctx.req_id, ctx.created, ctx.model, choices, usage)


def _echo_texts(n: int):
    def texts(mux: ChoiceMux) -> dict[int, str]:
        return {p * n + i: text or "" for p, text in mux.prompt_texts.items() for i in range(n)}
    return texts


async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await serve_generation(
        request, body, id_prefix="cmpl", prompts=completion_prompts(body),
        max_tokens=body.max_tokens, logprobs=body.logprobs, renderer=CompletionRenderer,
        submit_kwargs={"want_prompt_text": body.echo,
                       "add_special_tokens": body.add_special_tokens},
        echo=_echo_texts(body.n) if body.echo else None,
        prompt_logprobs=body.prompt_logprobs_count(), echo_only=body.echo_only())
