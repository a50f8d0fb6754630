"""`cadence diagnose TRACE|RESULT.json|URL`: is there interference, who causes it, what to change.

Registered on the `cadence` command (cadence/cli.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnose", help="explain prefill/decode interference in a trace, a bench result or a "
        "running server, and recommend scheduler settings for an SLO",
        description="Read a `cadence serve --trace` file, a `cadence bench --out` result.json, or "
        "scrape a running cadence server's /dashboard/events for --duration seconds; report "
        "stalls and their causes, TTFT by prompt length, queue vs prefill time; replay the "
        "workload in the simulator under other policies/budgets/ITL targets and recommend the "
        "setting that best meets --slo.")
    p.add_argument("source", help="trace JSONL file, bench result.json, or http(s)://host:port")
    p.add_argument("--slo", default=None,
                   help="per-request SLOs in seconds, e.g. ttft=2,itl=0.2 (default: itl = the "
                   "ITL target)")
    p.add_argument("--target-itl-ms", type=float, default=None,
                   help="gap that counts as a stall (default: the recording's own target, "
                   "else 100 ms)")
    p.add_argument("--out", default=None, help="folder for report.txt, diagnosis.json and PNGs")
    p.add_argument("--duration", type=float, default=30.0,
                   help="URL source: seconds to read the server's live events (default 30)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="URL source: the server's API key (default $OPENAI_API_KEY)")
    p.add_argument("--run", type=int, default=0, help="bench result: which run (default 0)")
    p.add_argument("--policy", default=None,
                   help="the setting the recording ran under, when the source does not say "
                   "(bench results): eager, chunked, slo or adaptive")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the recorded setting's token budget (with --policy)")
    p.add_argument("--cores", type=int, default=None,
                   help="cores the engine had (default: the trace's, else this machine's): "
                   "with more than one, --policy adaptive (split cores) is simulated too")
    p.add_argument("--no-whatif", action="store_true", help="skip the simulator replay")
    p.set_defaults(func=run)


def _machine_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run(a: argparse.Namespace) -> int:
    from cadence.diagnose.analysis import diagnose
    from cadence.diagnose.recording import load, scrape
    from cadence.diagnose.replay import recommend
    from cadence.diagnose.report import report_json, report_lines

    try:
        if a.source.startswith(("http://", "https://")):
            rec = scrape(a.source, a.duration, a.api_key)
        else:
            rec = load(a.source, a.run)
        if not rec.requests:
            raise ValueError(f"{a.source}: no request with a first token in what was read")
        if a.policy:
            rec.settings = {**rec.settings, "policy": a.policy,
                            "max_num_batched_tokens": a.max_num_batched_tokens or 512}
        target = a.target_itl_ms / 1000 if a.target_itl_ms else None
        d = diagnose(rec, target)
        rcm = None
        if not a.no_whatif:
            cores = a.cores or rec.num_cores or _machine_cores()
            rcm = recommend(rec, a.slo, d.target_itl_s, d.solo_itl_s, num_cores=cores,
                            prefill_stalls=len(d.prefill_stalls))
    except (ValueError, OSError) as exc:
        print(f"cadence diagnose: error: {exc}", file=sys.stderr)
        return 2
    lines = report_lines(d, rcm)
    print("\n".join(lines))
    if a.out:
        from cadence.diagnose.plots import plot_all

        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "report.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(a.out, "diagnosis.json"), "w", encoding="utf-8") as f:
            json.dump(report_json(d, rcm), f, indent=1)
        paths = plot_all(d, rcm, a.out)
        print(f"\nwrote {os.path.join(a.out, 'report.txt')}, diagnosis.json and "
              + ", ".join(os.path.basename(p) for p in paths))
    return 0

