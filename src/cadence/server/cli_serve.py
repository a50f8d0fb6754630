"""`cadence serve`: the OpenAI-compatible server. Flags come from the config dataclasses' help.

Scheduler, KV cache and engine flags are generated from the frozen configs' field metadata
(help, choices), so `--help` says what the code means; the names follow vLLM's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from typing import Any

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.engine.config import EngineConfig
from cadence.engine.engine_process import AdmissionLimits, EngineProcessConfig
from cadence.server.config import ServerConfig

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'2GiB', '512MiB', '1.5GB', '1000000' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use bytes or a number with KiB/MiB/GiB (or KB/MB/GB)")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return value


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


# (flag, config class, field name, argparse type or None for the field's own type)
_FLAGS: tuple[tuple[str, type, str, Any], ...] = (
    ("--model", EngineConfig, "model", str),
    ("--dtype", EngineConfig, "dtype", str),
    ("--device", EngineConfig, "device", str),
    ("--trace", EngineConfig, "trace_path", str),
    ("--seed", EngineConfig, "seed", int),
    ("--deterministic", EngineConfig, "deterministic", bool),
    ("--startup-profile", EngineConfig, "startup_profile", bool),
    ("--policy", SchedulerConfig, "policy", str),
    ("--max-num-batched-tokens", SchedulerConfig, "max_num_batched_tokens", int),
    ("--max-num-seqs", SchedulerConfig, "max_num_seqs", int),
    ("--long-prefill-token-threshold", SchedulerConfig, "long_prefill_token_threshold", int),
    ("--max-model-len", SchedulerConfig, "max_model_len", int),
    ("--scheduling-policy", SchedulerConfig, "scheduling", str),
    ("--target-itl-ms", SchedulerConfig, "target_itl_ms", float),
    ("--max-prefill-slowdown", SchedulerConfig, "max_prefill_slowdown", float),
    ("--max-stall-share", SchedulerConfig, "max_stall_share", float),
    ("--max-num-partial-prefills", SchedulerConfig, "max_num_partial_prefills", int),
    ("--max-long-partial-prefills", SchedulerConfig, "max_long_partial_prefills", int),
    ("--interject-short-prompts", SchedulerConfig, "interject_short_prompts", bool),
    ("--core-split", SchedulerConfig, "core_split", str),
    ("--split-prefill-chunk", SchedulerConfig, "split_prefill_chunk", int),
    ("--block-size", CacheConfig, "block_size", int),
    ("--num-gpu-blocks-override", CacheConfig, "num_blocks", int),
    ("--kv-cache-memory-bytes", CacheConfig, "kv_cache_memory_bytes", parse_size),
    ("--kv-cache-memory-fraction", CacheConfig, "kv_cache_memory_fraction", float),
    ("--enable-prefix-caching", CacheConfig, "enable_prefix_caching", bool),
    ("--num-swap-blocks", CacheConfig, "num_swap_blocks", int),
    ("--kv-offload-dir", CacheConfig, "kv_offload_dir", str),
    ("--kv-offload-disk-blocks", CacheConfig, "kv_offload_disk_blocks", int),
    ("--kv-offload-prefix-spill", CacheConfig, "kv_offload_prefix_spill", bool),
    ("--tokenizer", EngineConfig, "tokenizer", str),
    ("--chat-template", EngineConfig, "chat_template", str),
    ("--generation-config", EngineConfig, "generation_config", str),
    ("--quantization", EngineConfig, "quantization", str),
    ("--kv-cache-dtype", EngineConfig, "kv_cache_dtype", str),
    ("--enable-log-requests", ServerConfig, "enable_log_requests", bool),
    ("--host", ServerConfig, "host", str),
    ("--port", ServerConfig, "port", int),
    ("--api-key", ServerConfig, "api_key", str),
    ("--max-num-queued-requests", ServerConfig, "max_num_queued_requests", int),
    ("--max-num-queued-tokens", ServerConfig, "max_num_queued_tokens", int),
    ("--max-request-bytes", ServerConfig, "max_request_bytes", parse_size),
    ("--exit-on-engine-death", ServerConfig, "exit_on_engine_death", bool),
    ("--shutdown-grace-seconds", ServerConfig, "shutdown_grace_s", float),
    ("--in-process-engine", ServerConfig, "in_process_engine", bool),
    ("--engine-threads", ServerConfig, "engine_threads", int),
)


# Earlier cadence spellings, still accepted so existing scripts keep working.
_OLD_SPELLINGS = {"--num-gpu-blocks-override": ("--num-kv-blocks",),
                  "--kv-cache-memory-bytes": ("--kv-cache-memory",)}


def _dest(cls: type, name: str) -> str:
    return f"{cls.__name__}.{name}"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    groups = {
        EngineConfig: parser.add_argument_group("engine"),
        SchedulerConfig: parser.add_argument_group("scheduler"),
        CacheConfig: parser.add_argument_group("KV cache"),
        ServerConfig: parser.add_argument_group("server"),
    }
    for flag, cls, name, arg_type in _FLAGS:
        f = _field(cls, name)
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = meta.get("help", "")
        if arg_type is parse_size:
            help_text += " Accepts suffixes: 512MiB, 2GiB, 1.5GB."
        if default is not None:
            help_text += f" (default: {default})"
        # default=None everywhere: only flags actually given override the dataclass defaults.
        kwargs: dict[str, Any] = {"dest": _dest(cls, name), "default": None, "help": help_text}
        if arg_type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = arg_type
            if "choices" in meta:
                kwargs["choices"] = meta["choices"]
            else:
                kwargs["metavar"] = flag.lstrip("-").upper().replace("-", "_")
        groups[cls].add_argument(flag, *_OLD_SPELLINGS.get(flag, ()), **kwargs)
    # vLLM's positional form: `cadence serve MODEL` (the same as --model MODEL).
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="GGUF file or Hugging Face folder (same as --model).")
    groups[SchedulerConfig].add_argument(
        "--enable-chunked-prefill", dest="enable_chunked_prefill",
        action=argparse.BooleanOptionalAction, default=None,
        help="vLLM's switch, mapped onto the policies: on = --policy chunked, off = --policy "
        "eager.")
    # Tests swap in a fake engine ("module:function"); not part of the user-facing CLI.
    parser.add_argument("--engine-factory", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine-config-json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--uvicorn-log-level", "--log-level", dest="log_level", default="info",
                        choices=("critical", "error", "warning", "info", "debug", "trace"),
                        help="uvicorn log level (default: info).")
    from cadence.disagg.cli import add_disagg_serve_arguments
    from cadence.engine.vllm_options import add_vllm_arguments

    add_disagg_serve_arguments(parser)
    add_vllm_arguments(parser)  # after cadence's own flags: those of the same name win


def server_options_from_vllm(server: dict[str, Any]) -> dict[str, Any]:
    """ServerConfig fields from the vLLM server flags (names, CORS, root path)."""
    out: dict[str, Any] = {}
    names = server.get("served_model_name")
    if names:
        names = [str(n) for n in (names if isinstance(names, list) else [names])]
        out["served_model_name"], out["served_model_aliases"] = names[0], tuple(names[1:])
    for flag, field_name in (("allowed_origins", "cors_allowed_origins"),
                             ("allowed_methods", "cors_allowed_methods"),
                             ("allowed_headers", "cors_allowed_headers")):
        if flag in server:
            value = server[flag]
            values = value if isinstance(value, list) else [value]
            if len(values) == 1 and isinstance(values[0], list):
                values = values[0]  # vLLM's JSON list form: --allowed-origins '["*"]'
            out[field_name] = tuple(str(v) for v in values)
    if server.get("allow_credentials"):
        out["cors_allow_credentials"] = True
    if server.get("root_path"):
        out["root_path"] = str(server["root_path"])
    if server.get("return_tokens_as_token_ids"):
        out["return_tokens_as_token_ids"] = True
    parser, auto = server.get("tool_call_parser"), server.get("enable_auto_tool_choice")
    if parser is not None or auto:
        from cadence.server.tool_parsers import TOOL_PARSERS

        names = ", ".join(sorted(TOOL_PARSERS))
        if not auto:
            raise ValueError("--tool-call-parser needs --enable-auto-tool-choice (as in vLLM)")
        if parser not in TOOL_PARSERS:
            raise ValueError(f"--enable-auto-tool-choice needs --tool-call-parser, one of {names}"
                             + ("" if parser is None else f" (got {parser!r})"))
        out["tool_call_parser"] = parser
    if server.get("reasoning_parser"):
        from cadence.server.reasoning_parsers import check_reasoning_parser

        out["reasoning_parser"] = check_reasoning_parser(str(server["reasoning_parser"]))
    return out


def _values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    prefix = cls.__name__ + "."
    return {k[len(prefix):]: v for k, v in vars(args).items()
            if k.startswith(prefix) and v is not None}


def resolve_model_and_policy(args: argparse.Namespace) -> None:
    """Fold the positional MODEL and --enable-chunked-prefill into --model and --policy;
    ValueError when they contradict an explicit flag."""
    model_key, policy_key = _dest(EngineConfig, "model"), _dest(SchedulerConfig, "policy")
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        given = getattr(args, model_key, None)
        if given is not None and given != tag:
            raise ValueError(f"the positional model {tag!r} and --model {given!r} disagree")
        setattr(args, model_key, tag)
    chunked = getattr(args, "enable_chunked_prefill", None)
    if chunked is not None:
        wanted = "chunked" if chunked else "eager"
        given = getattr(args, policy_key, None)
        if given is not None and given != wanted:
            flag = "--enable-chunked-prefill" if chunked else "--no-enable-chunked-prefill"
            raise ValueError(f"{flag} means --policy {wanted}, but --policy {given} was given")
        setattr(args, policy_key, wanted)


def configs_from_args(args: argparse.Namespace) -> tuple[ServerConfig, EngineProcessConfig]:
    """Raises ValueError (a config's own check) with a message naming the bad value."""
    import json

    from cadence.engine.vllm_options import check_vllm_options, vllm_mapped, vllm_values

    resolve_model_and_policy(args)
    vllm_given = vllm_values(args)
    vllm_server = check_vllm_options(vllm_given, spell="flag")
    scheduler = SchedulerConfig(**_values(args, SchedulerConfig))
    # vLLM options mapped onto cadence's (--gpu-memory-utilization); cadence's own flag wins.
    cache = CacheConfig(**{**vllm_mapped(vllm_given), **_values(args, CacheConfig)})
    engine = EngineConfig(scheduler=scheduler, cache=cache, **_values(args, EngineConfig))
    server = ServerConfig(**_values(args, ServerConfig), **server_options_from_vllm(vllm_server))
    engine_dict = dataclasses.asdict(engine)
    if args.engine_config_json:
        engine_dict.update(json.loads(args.engine_config_json))
    process = EngineProcessConfig(
        engine_config=engine_dict,
        served_model_name=server.served_model_name,
        limits=AdmissionLimits(server.max_num_queued_requests, server.max_num_queued_tokens),
        engine_threads=server.engine_threads or os.cpu_count(),
        **({"engine_factory": args.engine_factory} if args.engine_factory else {}),
    )
    return server, process


def run(args: argparse.Namespace) -> int:
    from cadence.server.launcher import run_server

    from cadence.disagg.cli import disagg_config_from_args
    from cadence.disagg.launcher import run_disagg, worker_process_config

    try:
        server, process = configs_from_args(args)
        disagg = disagg_config_from_args(args)
    except (ValueError, TypeError) as exc:
        return user_error(str(exc))
    replicated = getattr(args, "disagg", None) or getattr(args, "data_parallel_size", None)
    if not replicated and not getattr(args, "role", None):
        problem = preflight_problem(server, process)
        if problem:
            return user_error(problem)
    if replicated:
        try:
            return run_disagg(args, server, process, disagg)
        except ValueError as exc:
            args.parser.error(str(exc))
    if getattr(args, "role", None):
        process = worker_process_config(process, disagg, process.engine_threads)
    return run_server(server, process, log_level=args.log_level)


def user_error(message: str) -> int:
    """A mistake on the command line: one line on stderr, no usage dump, no traceback."""
    import sys

    print(f"cadence serve: error: {message}", file=sys.stderr)
    return 2


def preflight_problem(server: ServerConfig, process: EngineProcessConfig) -> str | None:
    """What is wrong before anything loads (seconds, not a model load later): the port is
    taken, or the model path does not exist (with what to do about a Hugging Face hub id)."""
    import errno
    import socket

    if server.port:
        family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind((server.host, server.port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return (f"port {server.port} on {server.host} is already in use: stop what "
                            f"holds it, or pass --port N")
                return f"cannot listen on {server.host}:{server.port}: {exc.strerror}"
    model = process.engine_config.get("model")
    real_engine = process.engine_factory == EngineProcessConfig.engine_factory
    if real_engine:
        from cadence.engine.model_path import model_path_problem

        return model_path_problem(model)
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="Serve a model over an OpenAI-compatible HTTP API.",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics).")
    add_serve_arguments(parser)
    parser.set_defaults(func=run, parser=parser)
