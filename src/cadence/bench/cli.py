"""`cadence bench` and `cadence sweep`: registered on the `cadence` command (cadence/cli.py)."""

from __future__ import annotations

import argparse
import os
import sys

from cadence.bench.cli_args import (
    add_analysis_args,
    add_arrival_args,
    add_workload_args,
    analysis_from_args,
    arrival_from_args,
    float_list,
    int_list,
    workload_from_args,
)
from cadence.bench.config import BenchConfig, ClientConfig


def register(subparsers) -> None:
    """Add the `bench` and `sweep` subcommands."""
    bench = subparsers.add_parser(
        "bench", help="load-test an OpenAI-compatible server and report TTFT/ITL/interference",
        description="Send a seeded workload to an OpenAI-compatible /v1/completions endpoint, "
        "timestamp every streamed chunk, and write result.json, summary.md and plots.",
    )
    bench.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    bench.add_argument("--model", default=None, help="model name to send (default: first of /v1/models)")
    _add_common(bench)
    bench.set_defaults(func=_run_bench)

    sweep = subparsers.add_parser(
        "sweep", help="start `cadence serve` under a grid of scheduler settings and map the trade-off",
        description="For each (policy, budget, chunk cap), start `cadence serve`, run the same "
        "workload, and draw p99 ITL of interfered streams against TTFT of long prompts.",
    )
    sweep.add_argument("--policies", default="eager,chunked", help="comma-separated policies")
    sweep.add_argument("--budgets", type=int_list, default=(64, 256, 512), help="max_num_batched_tokens values")
    sweep.add_argument("--chunk-caps", type=int_list, default=(0,),
                       help="long_prefill_token_threshold values (0: no cap); chunked policy only")
    sweep.add_argument("--serve-arg", action="append", default=[],
                       help="extra argument for `cadence serve` (repeatable), e.g. --serve-arg=--model=PATH")
    sweep.add_argument("--port", type=int, default=0, help="port for the servers (0: a free one)")
    sweep.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for /health")
    sweep.add_argument("--model", default=None, help="model name to send (default: first of /v1/models)")
    _add_common(sweep)
    sweep.set_defaults(func=_run_sweep)


def _add_common(p: argparse.ArgumentParser) -> None:
    add_workload_args(p)
    add_arrival_args(p)
    add_analysis_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature sent")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (lengths then vary)")
    p.add_argument("--logprobs", action="store_true",
                   help="request logprobs=0 so every chunk lists its tokens (exact multi-token chunk counts)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds without data before a request fails")
    p.add_argument("--metrics-interval", type=float, default=0.25, help="seconds between /metrics scrapes (0: off)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default $OPENAI_API_KEY)")
    p.add_argument("--out", default=None, help="directory for result.json, summary.md and PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _bench_config(a: argparse.Namespace, url: str) -> BenchConfig:
    return BenchConfig(
        client=ClientConfig(url=url, model=a.model, temperature=a.temperature,
                            request_timeout_s=a.request_timeout, api_key=a.api_key,
                            ignore_eos=not a.no_ignore_eos, request_logprobs=a.logprobs),
        workload=workload_from_args(a),
        arrival=arrival_from_args(a),
        analysis=analysis_from_args(a),
        tokenizer=a.tokenizer,
        use_tokenizer=not a.no_tokenizer,
        metrics_interval_s=a.metrics_interval,
        progress=not a.no_progress,
    )


def _run_bench(a: argparse.Namespace) -> int:
    from cadence.bench.bench import BenchError, run_bench
    from cadence.bench.prompt_builder import PromptLengthError
    from cadence.bench.report import run_markdown
    from cadence.bench.token_counter import TokenizerLoadError

    try:
        cfg = _bench_config(a, a.url)
        result = run_bench(cfg, a.out)
    except (ValueError, BenchError, TokenizerLoadError, PromptLengthError, OSError) as exc:
        print(f"cadence bench: error: {exc}", file=sys.stderr)
        return 2
    try:
        for run in result["runs"]:
            print("\n".join(run_markdown(run)))
        if a.out:
            print(f"\nwrote {os.path.join(a.out, 'result.json')}, summary.md and plots")
    except BrokenPipeError:  # `cadence bench ... | head`: the reader left, the result is written
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0  # failed requests are results (listed in the report), not a failed benchmark


def _run_sweep(a: argparse.Namespace) -> int:
    from cadence.bench.bench import BenchError
    from cadence.bench.sweep import SweepConfig, run_sweep
    from cadence.bench.token_counter import TokenizerLoadError

    try:
        policies = tuple(p.strip() for p in a.policies.split(",") if p.strip())
        base = _bench_config(a, "http://127.0.0.1:0")
        scfg = SweepConfig(policies=policies, budgets=a.budgets, chunk_caps=a.chunk_caps,
                           serve_args=tuple(a.serve_arg), port=a.port, startup_timeout_s=a.startup_timeout)
        result = run_sweep(base, scfg, a.out)
    except (ValueError, BenchError, TokenizerLoadError, OSError) as exc:
        print(f"cadence sweep: error: {exc}", file=sys.stderr)
        return 2
    choice = result["choice"]
    print(f"\nsweep: {len(result['settings'])} settings, Pareto front: {', '.join(result['pareto']) or 'none'}")
    if choice:
        print(f"best for the SLO: {choice['name']} ({choice['reason']})")
    if a.out:
        print(f"wrote {os.path.join(a.out, 'sweep.json')}, sweep.md and sweep_map.png")
    return 0
