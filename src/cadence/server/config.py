"""ServerConfig: the HTTP front end's own knobs (the engine's live in EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerConfig:
    """How the OpenAI-compatible front end listens and guards itself."""

    host: str = field(default="127.0.0.1", metadata={"help": "Interface to listen on."})
    port: int = field(default=8000, metadata={"help": "TCP port to listen on."})
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "Model name clients must send and /v1/models lists "
                          "(default: the model file or folder name)."},
    )
    # Further names clients may send for the model (vLLM's --served-model-name A B C: A is
    # the one responses and /v1/models carry).
    served_model_aliases: tuple[str, ...] = ()
    # CORS (vLLM's --allowed-origins etc.; off unless origins are given).
    cors_allowed_origins: tuple[str, ...] = ()
    cors_allowed_methods: tuple[str, ...] = ("*",)
    cors_allowed_headers: tuple[str, ...] = ("*",)
    cors_allow_credentials: bool = False
    # The path prefix a reverse proxy serves the API under (vLLM's --root-path).
    root_path: str = ""
    # Tool calling (vLLM's --enable-auto-tool-choice --tool-call-parser NAME): the parser that
    # reads calls from a reply (server/tool_parsers.py); None: requests with tools are a 400.
    tool_call_parser: str | None = None
    # vLLM's --reasoning-parser NAME: replies are split into reasoning and content
    # (server/reasoning_parsers.py); None: the reasoning text stays in content.
    reasoning_parser: str | None = None
    # vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:<id>" unless a
    # request's return_tokens_as_token_ids says otherwise.
    return_tokens_as_token_ids: bool = False
    api_key: str | None = field(
        default=None,
        metadata={"help": "Require 'Authorization: Bearer KEY' on every route but /health."},
    )
    max_num_queued_requests: int | None = field(
        default=None,
        metadata={"help": "Answer 429 once this many requests wait for their first token."},
    )
    max_num_queued_tokens: int | None = field(
        default=None,
        metadata={"help": "Answer 429 once the waiting requests' prompts exceed this many tokens."},
    )
    shutdown_grace_s: float = field(
        default=5.0,
        metadata={"help": "On SIGINT/SIGTERM, let in-flight requests run this long, then abort "
                          "them (their streams end with finish_reason 'abort')."},
    )
    in_process_engine: bool = field(
        default=False,
        metadata={"help": "Run the engine loop in a thread of the server process instead of its "
                          "own process (for measuring what the split buys)."},
    )
    max_request_bytes: int = field(
        default=4 * 2**20,
        metadata={"help": "Answer 413 to a request body larger than this, before reading it "
                          "all (the API's prompts fit in far less)."},
    )
    exit_on_engine_death: bool = field(
        default=False,
        metadata={"help": "Exit non-zero when the engine process dies, for a supervisor to "
                          "restart the whole server (default: respawn the engine, answering "
                          "503 with Retry-After until it is back)."},
    )
    enable_log_requests: bool = field(
        default=False,
        metadata={"help": "Log every request: an access line per HTTP request (method, path, "
                          "status, duration) and what each generation asked for."},
    )
    engine_threads: int | None = field(
        default=None,
        metadata={"help": "torch threads of the engine (default: all cores)."},
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_num_queued_requests", "max_num_queued_tokens", "engine_threads",
                     "max_request_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
