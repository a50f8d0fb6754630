"""`cadence sim` (or `python -m cadence.sim`): compare batching policies on a simulated
doc-burst workload and print a table. No model, no torch: the real scheduler on a virtual
clock with a roofline (or trace-fitted) step cost."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TypeVar

from rich.console import Console

from cadence.sim.compare import policy_variants, run_comparison
from cadence.sim.cost_model import CostModel, RooflineCostModel
from cadence.sim.hardware import PROFILES, get_profile
from cadence.sim.model_shape import SMOLLM2_135M
from cadence.sim.report import comparison_table, summaries_as_dicts
from cadence.sim.trace_fit import fit_trace
from cadence.sim.workload import doc_burst

T = TypeVar("T")


def _parse(text: str, convert: Callable[[str], T], expected: str) -> T:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    values = _parse(text, lambda t: [int(v) for v in t.split(",") if v.strip()],
                    "comma-separated integers")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _float_list(text: str) -> list[float]:
    values = _parse(text, lambda t: [float(v) for v in t.split(",") if v.strip()],
                    "comma-separated numbers")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    value = _parse(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _nonnegative_float(text: str) -> float:
    value = _parse(text, float, "a number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cost = parser.add_argument_group("step cost")
    cost.add_argument(
        "--profile", choices=sorted(PROFILES), default="cpu-2core",
        help="hardware profile of the roofline cost model (SmolLM2-135M, bf16). "
        + "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values()),
    )
    cost.add_argument(
        "--trace", metavar="FILE",
        help="fit the step cost to a `cadence ... --trace FILE` JSONL file instead",
    )
    work = parser.add_argument_group("doc-burst workload")
    work.add_argument("--streams", type=int, default=8, help="streams decoding (default: 8)")
    work.add_argument("--stream-prompt", type=_positive_int, default=256, metavar="TOKENS",
                      help="stream prompt length, +-25%% (default: 256)")
    work.add_argument("--stream-output", type=_positive_int, default=600, metavar="TOKENS",
                      help="tokens each stream writes (default: 600)")
    work.add_argument("--doc-tokens", type=_positive_int, default=4096, metavar="TOKENS",
                      help="the document's prompt length (default: 4096)")
    work.add_argument("--doc-output", type=_positive_int, default=32, metavar="TOKENS",
                      help="tokens the document request writes (default: 32)")
    work.add_argument("--doc-arrival", type=_nonnegative_float, default=1.0, metavar="S",
                      help="when the document arrives, seconds (default: 1.0)")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    pol = parser.add_argument_group("policies")
    pol.add_argument("--budgets", type=_int_list, default=[128, 256, 512, 1024],
                     help="chunked policy token budgets (default: 128,256,512,1024)")
    pol.add_argument("--targets", type=_float_list, default=[25.0, 50.0, 100.0, 200.0],
                     help="slo policy ITL targets, ms (default: 25,50,100,200)")
    pol.add_argument("--eager-budget", type=_positive_int, default=512,
                     help="eager policy token budget (default: 512)")
    pol.add_argument("--slo-budget", type=_positive_int, default=2048,
                     help="slo policy token budget (default: 2048)")
    parser.add_argument("--json", metavar="FILE", help="also write the summaries as JSON")


def run(args: argparse.Namespace) -> int:
    if args.streams < 0:
        print("cadence sim: --streams must be >= 0", file=sys.stderr)
        return 2
    try:
        cost_model: CostModel
        if args.trace:
            cost_model = fit_trace(args.trace)
        else:
            cost_model = RooflineCostModel(SMOLLM2_135M, get_profile(args.profile))
    except (OSError, ValueError) as exc:
        print(f"cadence sim: {exc}", file=sys.stderr)
        return 2
    workload = doc_burst(
        num_streams=args.streams,
        stream_prompt_tokens=args.stream_prompt,
        stream_output_tokens=args.stream_output,
        doc_prompt_tokens=args.doc_tokens,
        doc_output_tokens=args.doc_output,
        doc_arrival_s=args.doc_arrival,
        seed=args.seed,
    )
    configs = policy_variants(
        budgets=args.budgets,
        targets_ms=args.targets,
        eager_budget=args.eager_budget,
        slo_budget=args.slo_budget,
    )
    try:
        summaries = run_comparison(workload, cost_model, configs)
    except ValueError as exc:  # e.g. a request longer than max_model_len
        print(f"cadence sim: {exc}", file=sys.stderr)
        return 2
    title = (
        f"doc-burst: {args.streams} streams, a {args.doc_tokens}-token document at "
        f"{args.doc_arrival:g} s; {cost_model.name}; seed {args.seed}"
    )
    Console(width=160).print(comparison_table(summaries, title))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"title": title, "rows": summaries_as_dicts(summaries)}, f, indent=2)
        except OSError as exc:
            print(f"cadence sim: cannot write {args.json}: {exc}", file=sys.stderr)
            return 2
    return 0


def register(subparsers) -> None:
    """Add `cadence sim`."""
    parser = subparsers.add_parser("sim", help="compare batching policies in the simulator",
                                   description=__doc__)
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cadence.sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
