"""CLI of disaggregated serving: `cadence router`, and the `cadence serve` flags --role,
--kv-transfer-address, --kv-lease-timeout, --kv-transfer-timeout, --engine-id, --disagg P:D,
--routing-policy and --distributed-executor-backend (cadence.server.cli_serve adds them)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from cadence.disagg.config import ROLES, DisaggConfig
from cadence.disagg.router.config import POLICIES, RouterConfig


def _help(cls: type, name: str) -> str:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.metadata.get("help", "") + f" (default: {f.default})"


def add_disagg_serve_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("disaggregated serving")
    group.add_argument("--role", choices=ROLES, default=None,
                       help=_help(DisaggConfig, "role") + " Without --role: a plain engine.")
    group.add_argument("--kv-transfer-address", default=None,
                       help=_help(DisaggConfig, "kv_transfer_address"))
    group.add_argument("--engine-id", default=None, help=_help(DisaggConfig, "engine_id"))
    group.add_argument("--kv-lease-timeout", type=float, default=None,
                       help=_help(DisaggConfig, "kv_lease_timeout_s"))
    group.add_argument("--kv-transfer-timeout", type=float, default=None,
                       help=_help(DisaggConfig, "kv_transfer_timeout_s"))
    group.add_argument("--kv-events-address", default=None,
                       help=_help(DisaggConfig, "kv_events_address"))
    group.add_argument("--data-parallel-size", type=int, default=None, metavar="N",
                       help="Start N identical replicas (--role both workers, the cores split "
                            "between them) and the router in front of them on --port; with "
                            "--routing-policy cache-aware|least-loaded|round-robin.")
    group.add_argument("--cache-load-weight", type=float, default=0.25,
                       help=_help(RouterConfig, "cache_load_weight"))
    group.add_argument("--disagg", default=None, metavar="P:D",
                       help="Start P prefill and D decode workers on this machine and the "
                            "router in front of them on --port.")
    group.add_argument("--routing-policy", choices=POLICIES, default="auto",
                       help=_help(RouterConfig, "routing_policy"))
    group.add_argument("--distributed-executor-backend", choices=("mp", "ray"), default="mp",
                       help="With --disagg or --data-parallel-size: workers as local processes (mp) or as Ray actors "
                            "(ray: joins the Ray cluster of RAY_ADDRESS, or starts a local one).")
    group.add_argument("--ray-worker-resource", default=None, metavar="NAME",
                       help="With --distributed-executor-backend ray: each worker asks for one "
                            "unit of the custom node resource NAME, so a node started with "
                            "`ray start --resources '{\"NAME\": k}'` hosts at most k workers "
                            "(default: 1 CPU each, spread over the nodes).")


def disagg_config_from_args(args: argparse.Namespace) -> DisaggConfig:
    values: dict[str, Any] = {"role": args.role or "both"}
    for flag, name in (("kv_transfer_address", "kv_transfer_address"),
                       ("engine_id", "engine_id"), ("kv_lease_timeout", "kv_lease_timeout_s"),
                       ("kv_transfer_timeout", "kv_transfer_timeout_s"),
                       ("kv_events_address", "kv_events_address")):
        if getattr(args, flag, None) is not None:
            values[name] = getattr(args, flag)
    return DisaggConfig(**values)


def run_router_command(args: argparse.Namespace) -> int:
    from cadence.disagg.router.app import run_router

    try:
        cfg = RouterConfig(prefill_urls=tuple(args.prefill or ()),
                           decode_urls=tuple(args.decode or ()),
                           worker_urls=tuple(args.worker or ()),
                           cache_load_weight=args.cache_load_weight, host=args.host,
                           port=args.port, routing_policy=args.routing_policy,
                           min_disagg_prompt_tokens=args.min_disagg_prompt_tokens,
                           api_key=args.api_key)
    except ValueError as exc:
        args.parser.error(str(exc))
    run_router(cfg, log_level=args.log_level)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "router", help="OpenAI-compatible router over replicas, prefill and decode workers.",
        description="Route each request colocated (a decode worker serves it whole) or "
                    "disaggregated (a prefill worker computes the prompt, a decode worker pulls "
                    "its KV and decodes), and pick the replica or decode worker by "
                    "--routing-policy (cache-aware: the longest cached prefix against load).")
    parser.add_argument("--prefill", nargs="+", action="extend", metavar="URL",
                        help="Prefill workers (cadence serve --role prefill|both).")
    parser.add_argument("--decode", nargs="+", action="extend", metavar="URL",
                        help="Decode workers (cadence serve --role decode|both).")
    parser.add_argument("--worker", nargs="+", action="extend", metavar="URL",
                        help="Replicas (cadence serve --role both) serving whole requests; "
                             "mixes with --prefill/--decode pools.")
    parser.add_argument("--cache-load-weight", type=float, default=0.25,
                        help=_help(RouterConfig, "cache_load_weight"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--routing-policy", choices=POLICIES, default="auto",
                        help=_help(RouterConfig, "routing_policy"))
    parser.add_argument("--min-disagg-prompt-tokens", type=int, default=0,
                        help="auto: shorter prompts are always served colocated (default: 0, "
                             "the measured cost model decides for every length).")
    parser.add_argument("--api-key", default=None,
                        help="Sent to the workers as 'Authorization: Bearer KEY'.")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(func=run_router_command, parser=parser)
