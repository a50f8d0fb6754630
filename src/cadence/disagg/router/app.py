"""`cadence router`: the OpenAI-compatible front end of disaggregated serving.

Each POST to /v1/completions or /v1/chat/completions is decided (policy.py): colocated, it goes
whole to the decode worker with the fewest outstanding tokens; disaggregated, a prefill worker
computes the prompt and the first token and answers with the handoff, then a decode worker pulls
the KV and streams every token (the first one at once). Workers validate requests themselves:
their errors reach the client unchanged. /metrics has the router's decisions, fallbacks and its
cost model; a background task scrapes the workers' /metrics for queue depths and KV transfer
counters (and the hop's round trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cadence.disagg.router.cache_events import CacheEventSubscriptions
from cadence.disagg.router.config import RouterConfig
from cadence.disagg.router.forward import Forwarder, error_json
from cadence.disagg.router.request_truncation import kept_prompt_tokens
from cadence.disagg.router.policy import CostModel, Decision, RoutingPolicy
from cadence.disagg.router.replicas import PromptBlocks, ReplicaSelector
from cadence.disagg.router.workers import Worker, WorkerPool

logger = logging.getLogger("cadence.router")

# Re-exported on the router's /metrics (per worker): what a benchmark of the whole needs.
WORKER_METRICS = ("cadence:kv_transfers_total", "cadence:kv_transfer_bytes_total",
                  "cadence:kv_transfer_seconds_total", "cadence:kv_transfer_failures_total",
                  "cadence:kv_bytes_served_total", "cadence:kv_leases_expired_total",
                  "cadence:num_requests_running", "cadence:num_requests_waiting",
                  "cadence:kv_cache_blocks_used")

ROUTES = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
DECISIONS_KEPT = 4096


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("cadence_router:requests", "Requests by how they were served.",
                                ["route"], registry=self.registry)
        self.decisions = Counter("cadence_router:decisions", "Routing decisions by reason.",
                                 ["reason"], registry=self.registry)
        self.fallbacks = Counter("cadence_router:fallbacks",
                                 "Disaggregated requests served colocated instead, by reason.",
                                 ["reason"], registry=self.registry)
        self.prefill_seconds = Histogram(
            "cadence_router:prefill_call_seconds", "Wall time of prefill calls (handoff).",
            registry=self.registry, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.cost = Gauge("cadence_router:cost_model", "The auto policy's measured estimates.",
                          ["term"], registry=self.registry)
        self.worker = Gauge("cadence_router:worker_metric",
                            "Queue and KV transfer counters last scraped from each worker.",
                            ["worker", "role", "name"], registry=self.registry)


def _prompt_size(kind: str, body: dict[str, Any]) -> tuple[int, int | None]:
    """(characters of prompt text, exact token count when the prompt is token ids)."""
    if kind == "chat":
        chars = 0
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            chars += len(content or "") + 16  # the chat template's markers
        return chars, None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return len(prompt), None
    if isinstance(prompt, list):
        return 0, len(prompt)
    return 0, 1


class Router:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.prefill = WorkerPool("prefill", cfg.prefill_urls)
        self.decode = WorkerPool("decode", cfg.serving_urls)
        self.model = CostModel()
        self.policy = RoutingPolicy(cfg.disagg_policy, self.model, cfg.min_disagg_prompt_tokens)
        self.replicas = ReplicaSelector(cfg.replica_policy, cfg.cache_load_weight)
        self.cache_events: CacheEventSubscriptions | None = None
        # The workers' context length, from their /tokenize replies (None until one came).
        self.max_model_len: int | None = None
        self.metrics = RouterMetrics()
        self.client: httpx.AsyncClient | None = None
        self.forward: Forwarder | None = None
        self._scraped: dict[str, dict[str, float]] = {}
        # The latest decisions, one record per request (GET /decisions): what a benchmark
        # counts per prompt length, and what an operator reads to see why a request went where.
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.num_decisions = 0

    async def start(self) -> None:
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.cfg.request_timeout_s, connect=self.cfg.connect_timeout_s),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self.forward = Forwarder(self.client, self.cfg.unhealthy_cooldown_s, headers)
        if self.replicas.policy == "cache-aware":
            self.cache_events = CacheEventSubscriptions(self.replicas.events)

    async def stop(self) -> None:
        if self.cache_events is not None:
            await self.cache_events.close()
        if self.client is not None:
            await self.client.aclose()

    # ---- one request
    async def handle(self, request: Request, path: str) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_json(400, "the body is not valid JSON", "invalid_json"), 400)
        if not isinstance(body, dict):
            return JSONResponse(error_json(400, "the body must be a JSON object", "invalid_json"),
                                400)
        body.pop("kv_transfer_params", None)  # the router's own field towards workers
        chars, exact = _prompt_size(ROUTES[path], body)
        tokens = exact if exact is not None else self.model.estimate_tokens(chars)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        max_tokens = max_tokens if isinstance(max_tokens, int) else 16
        prompt: PromptBlocks | None = None
        ids = (await self._prompt_token_ids(ROUTES[path], body)
               if self.replicas.policy == "cache-aware" else None)
        # truncate_prompt_tokens: the worker runs (and its KV holds) only what is kept.
        if body.get("truncate_prompt_tokens") == -1 and self.max_model_len is None:
            await self._learn_context_length()
        keep = kept_prompt_tokens(ROUTES[path], body, self.max_model_len)
        if ids is not None:
            prompt = PromptBlocks.of_request(ids, body, keep)
            tokens = len(prompt)
        elif keep is not None:
            tokens = min(tokens, keep)
        order = self.replicas.order(self.decode.workers, prompt, tokens, max_tokens)
        # What the request costs each worker (its miss there + its output), taken before this
        # routing adds its prompt to the session-affinity record.
        misses = ({w.url: self.replicas.miss_tokens(w, prompt) for w in order}
                  if prompt is not None else {})

        def work(worker: Worker) -> int:
            return misses.get(worker.url, tokens) + max_tokens

        decode = order[0] if order else None
        if decode is not None:
            self.model.observe_arrival(decode.outstanding_requests)
        decision = self.policy.decide(tokens, self.prefill.pick(), decode,
                                      wants_logprobs=bool(body.get("logprobs")) or
                                      body.get("prompt_logprobs") is not None or
                                      (bool(body.get("echo")) and
                                       body.get("logprobs") is not None))
        if max_tokens == 1 and decision.disaggregate:
            decision = type(decision)(False, "one token asked")
        self.metrics.decisions.labels(decision.reason).inc()
        self._record(tokens, exact is not None, decision, decode, prompt, order, max_tokens)
        if decode is not None:
            self.replicas.sent_to(decode, prompt)
        if decision.disaggregate:
            handoff = await self.forward.prefill(self.prefill, path, body, tokens)
            if isinstance(handoff, Response):
                return handoff
            if handoff is None:
                self.metrics.fallbacks.labels("no prefill worker answered").inc()
            elif handoff.kv_transfer_params is None:
                self.metrics.fallbacks.labels("finished at its first token").inc()
            else:
                self.metrics.prefill_seconds.observe(handoff.seconds)
                if exact is None:
                    self.model.observe_prompt(chars, handoff.num_prompt_tokens)
                if handoff.worker_was_idle:
                    self.model.observe_prefill(
                        handoff.num_prompt_tokens - handoff.num_cached_tokens, handoff.seconds)
                self.metrics.requests.labels("disaggregated").inc()
                return await self.forward.relay(
                    self.decode, path, {**body, "kv_transfer_params": handoff.kv_transfer_params},
                    handoff.num_prompt_tokens + max_tokens, order=order, work=work)
        self.metrics.requests.labels("colocated").inc()
        return await self.forward.relay(self.decode, path, body, tokens + max_tokens,
                                        order=order, work=work)

    async def _prompt_token_ids(self, kind: str, body: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids as the workers compute them: given, or from a worker's
        /tokenize (chat templates are untrusted code: only the workers render them, in their
        sandboxed processes). None when no worker tokenized it (routing goes on without)."""
        prompt = body.get("prompt")
        if kind == "completions":
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0],
                                                                             (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return prompt
            if not isinstance(prompt, str):
                return None
            ask: dict[str, Any] = {"prompt": prompt}
        else:
            ask = {"messages": body.get("messages")}
        # The fields that change the ids (a worker refuses a bad value: routing goes on without).
        keys = ("add_special_tokens",) if kind == "completions" else (
            "add_generation_prompt", "chat_template_kwargs", "add_special_tokens",
            "chat_template", "continue_final_message", "tools", "documents", "reasoning_effort")
        for key in keys:
            if key in body:
                ask[key] = body[key]
        for worker in self.decode.candidates()[:2]:
            try:
                resp = await self.client.post(worker.url + "/tokenize", json=ask, timeout=10.0,
                                              headers=self.forward.headers)
            except httpx.HTTPError:
                worker.mark_failed(self.cfg.unhealthy_cooldown_s)
                continue
            if resp.status_code != 200:
                # The worker rejects it (so will the request itself, unless it is truncated:
                # /tokenize refuses a text too long for the context, the request cuts it).
                return None
            reply = resp.json()
            if isinstance(reply.get("max_model_len"), int):  # resolves truncate_prompt_tokens -1
                self.max_model_len = reply["max_model_len"]
            tokens = reply.get("tokens")
            return tokens if isinstance(tokens, list) else None
        return None

    async def _learn_context_length(self) -> None:
        """The workers' max_model_len from a worker's /v1/models (once: they serve one
        model), which truncate_prompt_tokens -1 needs; left unknown when none answers."""
        for worker in self.decode.candidates()[:2]:
            try:
                resp = await self.client.get(worker.url + "/v1/models", timeout=10.0,
                                             headers=self.forward.headers)
                context = resp.json()["data"][0].get("max_model_len")
            except (httpx.HTTPError, ValueError, LookupError, AttributeError, TypeError):
                continue
            if isinstance(context, int) and context > 0:
                self.max_model_len = context
                return

    def _record(self, tokens: int, exact: bool, decision: Decision, worker: Worker | None = None,
                prompt: PromptBlocks | None = None, order: list[Worker] | None = None,
                max_tokens: int = 16) -> None:
        record = {
            "seq": self.num_decisions, "t": time.time(), "prompt_tokens": tokens,
            "prompt_tokens_exact": exact, "disaggregate": decision.disaggregate,
            "reason": decision.reason, "streams": round(decision.streams, 3),
            "gain_s": round(decision.gain_s, 4), "cost_s": round(decision.cost_s, 4),
            "worker": worker.url if worker is not None else None,
            "replica_policy": self.replicas.policy}
        if worker is not None and prompt is not None:
            cached, source = self.replicas.cached_tokens(worker, prompt)
            record.update(expected_cached_tokens=cached, cached_from=source)
            # Every candidate as the scorer saw it (best first): whether the chosen replica
            # held the longest prefix, and if not which term (streams, load, KV room) moved
            # the request elsewhere (benchmarks/replica_bench.py counts them).
            record["candidates"] = [
                {"worker": w.url, "healthy": w.healthy,
                 "cached_tokens": self.replicas.cached_tokens(w, prompt)[0],
                 "cost": {k: round(v, 1) for k, v in
                          self.replicas.cost_terms(w, prompt, max_tokens).items()},
                 "streams": w.outstanding_requests, "work": w.outstanding_work}
                for w in (order or [])]
        self.decisions.append(record)
        self.num_decisions += 1

    def decisions_since(self, seq: int) -> dict[str, Any]:
        return {"next": self.num_decisions,
                "decisions": [d for d in self.decisions if d["seq"] >= seq]}

    # ---- worker /metrics
    async def scrape_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._scrape(w) for w in self.prefill.workers
                                   + self.decode.workers), return_exceptions=True)
            await asyncio.sleep(self.cfg.scrape_interval_s)

    async def _scrape(self, worker: Worker) -> None:
        start = time.perf_counter()
        try:
            resp = await self.client.get(worker.url + "/metrics", timeout=5.0,
                                         headers=self.forward.headers)
            resp.raise_for_status()
        except httpx.HTTPError:
            worker.mark_failed(self.cfg.unhealthy_cooldown_s)
            return
        self.model.observe_hop(time.perf_counter() - start)
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(resp.text):
            for sample in family.samples:
                values.setdefault(sample.name, sample.value)
        worker.num_running = int(values.get("cadence:num_requests_running", 0))
        worker.num_waiting = int(values.get("cadence:num_requests_waiting", 0))
        if self.cache_events is not None:
            self.cache_events.ensure(worker.url, int(values.get("cadence:kv_events_port", 0)))
        per_token = values.get("cadence:kv_bytes_per_token", 0.0)
        if per_token:
            self.model.kv_bytes_per_token = per_token
        previous = self._scraped.get(worker.url)
        if previous is not None:
            num_bytes = values.get("cadence:kv_transfer_bytes_total", 0) - previous.get(
                "cadence:kv_transfer_bytes_total", 0)
            seconds = values.get("cadence:kv_transfer_seconds_total", 0) - previous.get(
                "cadence:kv_transfer_seconds_total", 0)
            self.model.observe_transfers(num_bytes, seconds)
        self._scraped[worker.url] = values
        worker.metrics = values

    def render_metrics(self) -> bytes:
        for term, value in self.model.to_dict().items():
            if isinstance(value, float):
                self.metrics.cost.labels(term).set(value)
        for worker in self.prefill.workers + self.decode.workers:
            for name in WORKER_METRICS:
                if name in worker.metrics:
                    self.metrics.worker.labels(worker.url, worker.role, name).set(
                        worker.metrics[name])
        return generate_latest(self.metrics.registry)


def create_router_app(cfg: RouterConfig) -> FastAPI:
    router = Router(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await router.start()
        scraper = asyncio.create_task(router.scrape_forever())
        try:
            yield
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await scraper
            await router.stop()

    app = FastAPI(title="cadence router", lifespan=lifespan)
    app.state.router = router

    for path in ROUTES:
        async def route(request: Request, _path: str = path) -> Response:
            return await router.handle(request, _path)
        app.add_api_route(path, route, methods=["POST"])

    # The models list and OpenAI's retrieve-model route, answered by the first reachable
    # decode worker (every worker serves the same model under the same names).
    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    async def models(request: Request) -> Response:
        for worker in router.decode.candidates():
            try:
                resp = await router.client.get(worker.url + request.url.path,
                                               headers=router.forward.headers)
            except httpx.HTTPError:
                worker.mark_failed(cfg.unhealthy_cooldown_s)
                continue
            return Response(resp.content, status_code=resp.status_code,
                            media_type="application/json")
        return JSONResponse(error_json(503, "no decode worker reachable", "no_worker_available"),
                            503)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = any(w.healthy for w in router.decode.workers)
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "routing_policy": cfg.routing_policy,
                             "workers": [{"url": w.url, "healthy": w.healthy,
                                          "outstanding_requests": w.outstanding_requests}
                                         for w in router.decode.workers],
                             "cost_model": router.model.to_dict()},
                            status_code=200 if ok else 503)

    @app.get("/decisions")
    async def decisions(since: int = 0) -> JSONResponse:
        """The routing decisions from number `since` on (the latest DECISIONS_KEPT), each with
        the prompt's tokens (estimated from its characters unless given as token ids), the
        reason, and the streams, gain and cost the auto policy weighed."""
        return JSONResponse(router.decisions_since(since))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(router.render_metrics(), media_type="text/plain; version=0.0.4")

    return app


def run_router(cfg: RouterConfig, log_level: str = "info") -> None:
    import uvicorn

    uvicorn.run(create_router_app(cfg), host=cfg.host, port=cfg.port, log_level=log_level,
                access_log=False)
