"""The FastAPI app: OpenAI routes, /health, /metrics; the engine client's lifetime.

The engine client is started by the app's lifespan, inside the server's event loop (its ZeroMQ
sockets belong to that loop), and stopped on shutdown: live requests are aborted with a reason
and the engine process exits. An EngineSupervisor respawns an engine that dies (or exits the
server, with --exit-on-engine-death). The RequestGuard middleware checks the API key and the
body size before FastAPI reads the body.
"""

from __future__ import annotations

import contextlib
import os
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cadence import __version__
from cadence.engine.async_client import AsyncEngineClient, EngineDeadError
from cadence.engine.engine_process import EngineProcessConfig
from cadence.server.auth import check_api_key
from cadence.server.config import ServerConfig
from cadence.server.dashboard import router as dashboard_router
from cadence.server.dashboard_feed import LiveTelemetry
from cadence.server.engine_supervisor import EngineSupervisor
from cadence.server.errors import APIError, error_headers, install_error_handlers
from cadence.server.invocations import invocations
from cadence.server.openapi_spec import install_openapi
from cadence.server.request_guard import RequestGuard
from cadence.server.serving_chat import create_chat_completion
from cadence.server.responses_store import ResponseStore
from cadence.server.serving_completions import create_completion
from cadence.server.serving_responses import create_response, retrieve_response
from cadence.server.serving_tokens import detokenize, tokenize, tokenizer_info, version
from cadence.telemetry.prometheus import CONTENT_TYPE, PrometheusMetrics


logger = logging.getLogger("cadence.server")


@dataclass
class ServerState:
    """What the route handlers share (on app.state.server); filled in at startup."""

    config: ServerConfig
    engine_config: EngineProcessConfig
    client: AsyncEngineClient | None = None
    metrics: PrometheusMetrics | None = None
    telemetry: LiveTelemetry | None = None  # /metrics + attribution + dashboard viewers
    model_name: str = ""
    # Every name a request may send for the model (model_name first).
    model_names: tuple[str, ...] = ()
    max_model_len: int = 0
    # The most characters one token covers (bounds prompt texts before tokenizing; None: unknown).
    max_token_chars: int | None = None
    started_at: int = 0
    supervisor: EngineSupervisor | None = None
    # Set by the launcher: stop the server with this exit code (engine death, with the flag).
    request_exit: Callable[[int], None] | None = None
    # Sampling defaults from the model's generation_config, for fields a request leaves unset.
    generation_defaults: dict = dataclasses.field(default_factory=dict)
    # /v1/responses answers kept for previous_response_id (in memory, bounded).
    responses: ResponseStore = dataclasses.field(default_factory=ResponseStore)


def _require_engine(request: Request) -> None:
    client = request.app.state.server.client
    if client is None or not client.is_healthy:
        reason = client.dead_reason if client is not None else None
        raise APIError(503, f"The engine is not available{': ' + reason if reason else ''}; "
                       "retry later.", code="engine_unavailable")


api = APIRouter(dependencies=[Depends(check_api_key)])


def _model_card(server: ServerState, name: str) -> dict:
    """One model object as /v1/models lists it (OpenAI's fields plus vLLM's max_model_len)."""
    return {"id": name, "object": "model", "created": server.started_at,
            "owned_by": "cadence", "root": server.model_name, "parent": None,
            "max_model_len": server.max_model_len}


@api.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    server: ServerState = request.app.state.server
    return JSONResponse({
        "object": "list",
        # The served name, then --served-model-name's further names (as vLLM lists them).
        "data": [_model_card(server, name)
                 for name in (server.model_name, *server.config.served_model_aliases)],
    })


# OpenAI's retrieve-model route (`client.models.retrieve`); `:path` because served names are
# often repository ids with a slash ("meta-llama/Llama-3.2-1B-Instruct").
@api.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    server: ServerState = request.app.state.server
    listed = (server.model_name, *server.config.served_model_aliases)
    if model_id in listed or model_id in server.model_names:
        return JSONResponse(_model_card(server, model_id))
    raise APIError(404, f"The model `{model_id}` does not exist; this server serves "
                   f"{', '.join(repr(n) for n in listed)}.", code="model_not_found",
                   param="model")


@api.get("/metrics")
async def metrics(request: Request) -> Response:
    server: ServerState = request.app.state.server
    if server.client is not None and server.client.is_healthy:
        # A fresh snapshot, so gauges (KV blocks) reflect aborts that just happened; inside a
        # long step the engine answers only after it, and the heartbeat (0.5 s) keeps them fresh.
        await server.client.stats(timeout_s=0.5)
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)


api.add_api_route("/v1/completions", create_completion, methods=["POST"],
                  dependencies=[Depends(_require_engine)])
api.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"],
                  dependencies=[Depends(_require_engine)])
# OpenAI's Responses API, served by the chat path (serving_responses.py).
api.add_api_route("/v1/responses", create_response, methods=["POST"],
                  dependencies=[Depends(_require_engine)])
api.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"])
# vLLM's SageMaker route: the same requests, dispatched by their shape (not in the API
# document: it is an alias of the two above).
api.add_api_route("/invocations", invocations, methods=["POST"], include_in_schema=False,
                  dependencies=[Depends(_require_engine)])
api.add_api_route("/tokenize", tokenize, methods=["POST"], dependencies=[Depends(_require_engine)])
api.add_api_route("/detokenize", detokenize, methods=["POST"],
                  dependencies=[Depends(_require_engine)])
api.add_api_route("/tokenizer_info", tokenizer_info, methods=["GET"],
                  dependencies=[Depends(_require_engine)])


async def health(request: Request) -> JSONResponse:
    client = request.app.state.server.client
    if client is None or not client.is_healthy:
        return JSONResponse({"status": "unavailable"}, status_code=503,
                            headers=error_headers(503))
    return JSONResponse({"status": "ok"})


def log_startup_summary(state: ServerState) -> None:
    """One line that says what is served: model, dtype, device, KV cache, kernels, policy."""
    summary = dict(state.client.info.summary)
    summary["served_model_name"] = state.model_name
    summary.setdefault("max_model_len", state.max_model_len)
    if state.generation_defaults:
        summary["generation_defaults"] = state.generation_defaults
    logger.info("cadence %s serving %s", __version__,
                ", ".join(f"{k}={v}" for k, v in summary.items()))


def create_app(config: ServerConfig, engine_config: EngineProcessConfig) -> FastAPI:
    """The app; the engine starts when the server runs the lifespan."""
    state = ServerState(config=config, engine_config=engine_config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.supervisor = EngineSupervisor(
            state, engine_config, in_process=config.in_process_engine,
            exit_on_death=config.exit_on_engine_death,
            request_exit=lambda code: state.request_exit and state.request_exit(code))
        try:
            await state.supervisor.start()
        except EngineDeadError as exc:
            if state.request_exit is None:
                raise
            # The model did not load (bad folder, unsupported architecture): one line saying
            # why, then exit 1; not uvicorn's lifespan traceback, and no "running on" line
            # (the lifespan runs before uvicorn binds, so nothing else is left to close).
            logger.error("cadence serve: %s", startup_failure(exc))
            await state.supervisor.stop()
            logging.shutdown()
            os._exit(1)
        state.model_name = config.served_model_name or state.client.info.model_name
        state.model_names = served_names(state.model_name, config,
                                         engine_config.engine_config.get("model"))
        state.metrics = PrometheusMetrics(state.model_name)
        sched = engine_config.engine_config.get("scheduler") or {}
        state.telemetry = LiveTelemetry(
            state.metrics, float(sched.get("target_itl_ms") or 100.0) / 1000.0,
            settings={"model": state.model_name, **sched})
        state.client.attach_metrics(state.telemetry)
        state.max_model_len = state.client.info.max_model_len
        state.max_token_chars = state.client.info.max_token_chars
        state.generation_defaults = dict(state.client.info.generation_defaults)
        state.started_at = int(time.time())
        log_startup_summary(state)
        try:
            yield
        finally:
            await state.supervisor.stop()

    # strict_content_type=False: a JSON body sent without any Content-Type is read as JSON, as
    # FastAPI did before 0.132 (and vLLM's servers do); a body declared as something else
    # (a form, text/plain) is still a 400 saying what to send (errors.py). Older FastAPI
    # versions keep the unknown keyword as an extra.
    app = FastAPI(title="cadence", lifespan=lifespan, strict_content_type=False)
    app.state.server = state
    install_error_handlers(app)
    app.include_router(api)
    app.include_router(dashboard_router)
    app.add_api_route("/health", health, methods=["GET"])
    # vLLM's /ping (SageMaker's liveness probe): /health's answer, GET or POST.
    app.add_api_route("/ping", health, methods=["GET", "POST"])
    install_openapi(app)
    app.add_middleware(RequestGuard, max_request_bytes=config.max_request_bytes,
                       api_key=lambda: config.api_key)
    app.add_api_route("/version", version, methods=["GET"])
    if config.cors_allowed_origins:
        # Added last, so outermost: preflight requests are answered before the API key check.
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_allowed_origins),
                           allow_methods=list(config.cors_allowed_methods),
                           allow_headers=list(config.cors_allowed_headers),
                           allow_credentials=config.cors_allow_credentials)
    return app


def startup_failure(exc: BaseException) -> str:
    """The engine's start error as the user should read it: what failed, without the wrapper
    names ("engine failed to start: ModelLoadError: ...")."""
    text = str(exc).removeprefix("engine failed to start: ")
    for wrapper in ("ModelLoadError: ", "ValueError: ", "TokenizerError: "):
        text = text.removeprefix(wrapper)
    return f"the model did not load: {text.strip().splitlines()[-1] if text.strip() else exc}"


def served_names(name: str, config: ServerConfig, model_path: str | None) -> tuple[str, ...]:
    """The names requests may use: the served name, --served-model-name's further names, and,
    without --served-model-name, the model path as given (vLLM's name for it) and its
    absolute form."""
    names = [name, *config.served_model_aliases]
    if config.served_model_name is None and model_path:
        names += [model_path, os.path.abspath(model_path), model_path.rstrip("/")]
    return tuple(dict.fromkeys(names))
