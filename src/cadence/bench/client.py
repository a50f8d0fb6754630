"""The streaming client: send one completion request, timestamp every SSE chunk.

Timestamps are time.perf_counter() taken as each `data:` line is read, relative to the run's
start. Every failure becomes a `Failure` with a reason; nothing raises out of `stream_request`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from cadence.bench.config import ClientConfig
from cadence.bench.records import STATUS_FAILED, Failure, RequestRecord
from cadence.bench.sse import DONE, SSEFormatError, data_payload, parse_chunk
from cadence.bench.workloads import RequestSpec

_MAX_MESSAGE = 500


def completion_body(cfg: ClientConfig, model: str, spec: RequestSpec) -> dict[str, Any]:
    """The /v1/completions request body for one spec."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": spec.prompt,
        "max_tokens": spec.max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.request_logprobs:
        body["logprobs"] = 0
    return body


def auth_headers(cfg: ClientConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def stream_request(
    http: httpx.AsyncClient, cfg: ClientConfig, model: str, spec: RequestSpec, t0: float, on_chunk=None
) -> RequestRecord:
    """Send `spec`, read its stream to the end, return its record (failed ones included).

    `t0` is the run's perf_counter origin. `on_chunk(record)` is called after each token-carrying
    chunk (the runner uses it to know when streams start decoding).
    """
    rec = RequestRecord(
        index=spec.index,
        kind=spec.kind,
        prompt_tokens=spec.prompt_tokens,
        max_tokens=spec.max_tokens,
        prompt_sha1=spec.prompt_sha1,
        send_time=time.perf_counter() - t0,
    )
    url = cfg.url.rstrip("/") + "/v1/completions"
    saw_done = False
    try:
        async with http.stream("POST", url, json=completion_body(cfg, model, spec), headers=auth_headers(cfg)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                rec.failure = Failure("http", _error_message(body), http_status=resp.status_code)
            else:
                async for line in resp.aiter_lines():
                    now = time.perf_counter() - t0
                    payload = data_payload(line)
                    if payload is None:
                        continue
                    if payload == DONE:
                        saw_done = True
                        break
                    info = parse_chunk(payload)
                    if info.error is not None:
                        rec.failure = Failure("server_error", info.error[:_MAX_MESSAGE])
                        break
                    if info.usage is not None:
                        rec.usage_prompt_tokens = info.usage.get("prompt_tokens")
                        rec.usage_completion_tokens = info.usage.get("completion_tokens")
                    if info.finish_reason is not None:
                        rec.finish_reason = info.finish_reason
                    if info.tokens > 0:
                        rec.chunk_times.append(now)
                        rec.chunk_tokens.append(info.tokens)
                        rec.counted_by_logprobs = rec.counted_by_logprobs or info.counted_by_logprobs
                        if on_chunk is not None:
                            on_chunk(rec)
    except httpx.TimeoutException as exc:
        rec.failure = Failure("timeout", f"{type(exc).__name__}: no data within {cfg.request_timeout_s} s")
    except httpx.ConnectError as exc:
        rec.failure = Failure("connect", f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE])
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        rec.failure = Failure("stream_cut", f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE])
    except (httpx.HTTPError, SSEFormatError) as exc:
        rec.failure = Failure("client", f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE])
    rec.end_time = time.perf_counter() - t0
    if rec.failure is None and not saw_done and rec.finish_reason is None:
        rec.failure = Failure("stream_cut", "stream ended without a finish_reason or [DONE]")
    if rec.failure is None and rec.finish_reason in ("abort", "error"):
        rec.failure = Failure("finish_reason", f"server finished the request with finish_reason={rec.finish_reason}")
    if rec.failure is not None:
        rec.status = STATUS_FAILED
    return rec


def _error_message(body: str) -> str:
    """The message of an OpenAI-style error body, else the body itself (truncated)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body[:_MAX_MESSAGE] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            return str(err.get("message", err))[:_MAX_MESSAGE]
        return str(err)[:_MAX_MESSAGE]
    return body[:_MAX_MESSAGE]


async def served_model_name(http: httpx.AsyncClient, cfg: ClientConfig) -> str:
    """The first model id from GET /v1/models (used when --model is not given)."""
    resp = await http.get(cfg.url.rstrip("/") + "/v1/models", headers=auth_headers(cfg))
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data or "id" not in data[0]:
        raise ValueError(f"{cfg.url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])
