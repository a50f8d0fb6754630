"""The doc-burst's largest stream gaps over HTTP, split into the engine's part and the delivery's
(issue 34, --core-split interleave).

    CADENCE_DECODE_SHARE=S .venv/bin/python benchmarks/interleave_http_gaps.py [--repeats 2]

One `cadence serve --policy adaptive --trace` (core_split_bench.py's doc-burst, the same
requests), the client's token times per stream kept. Per run, for the --top longest client gaps
of one stream: the gap, the engine's gap between the two decode steps that made those tokens
(their ends in the trace, the same monotonic clock), each token's delivery time (client receipt
after the step's end), and the steps the engine ran between them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile

import httpx

sys.path.insert(0, os.path.dirname(__file__))
import core_split_bench as bench  # noqa: E402
from disagg_bench import start  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--extra", default="")
    args = parser.parse_args()
    out_dir = tempfile.mkdtemp(prefix="interleave-http-gaps-")
    trace = os.path.join(out_dir, "trace.jsonl")
    runs: list[list[dict]] = []
    one_request = bench.one_request

    async def kept(*a, **k):
        result = await one_request(*a, **k)
        runs[-1].append(result)
        return result

    bench.one_request = kept
    proc, url = start(bench.CONFIGS["interleave"] + ["--trace", trace] + args.extra.split(),
                      os.path.join(out_dir, "server.log"))
    try:
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        summaries = []
        for rep in range(args.repeats):
            runs.append([])
            summaries.append(asyncio.run(bench.doc_burst(url, model, 1650, rep)))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    steps = []
    with open(trace) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "step":
                steps.append(rec)
    steps.sort(key=lambda s: s["t_end"])
    for rep, (summary, results) in enumerate(zip(summaries, runs)):
        # In the order they ended: the document (its prompt the longest) first.
        doc = max(results, key=lambda r: r["prompt_tokens"])
        window = (doc["sent"], doc["times"][0] + 1.0)
        stream = max((r for r in results if r is not doc), key=lambda r: max(
            (b - a for a, b in zip(r["times"], r["times"][1:]) if b >= window[0] and a <= window[1]),
            default=0))
        print(json.dumps({"rep": rep, "max_stall_s": round(summary["max_stall_s"], 4),
                          "doc_ttft_s": round(summary["doc_ttft_s"], 3)}), flush=True)
        # Steps that sampled a token for this stream: its decode steps (num_decode_tokens > 0
        # and no prompt), matched to the client's tokens in order from the end of its prompt.
        gaps = sorted(((b - a, i) for i, (a, b) in enumerate(zip(stream["times"], stream["times"][1:]))
                       if b >= window[0] and a <= window[1]), reverse=True)[:args.top]
        for gap, i in gaps:
            a, b = stream["times"][i], stream["times"][i + 1]
            # The engine steps whose end precedes each receipt most closely (decode steps only).
            decodes = [s for s in steps if s["num_decode_tokens"] and not s["num_prefill_tokens"]]
            end_a = max((s["t_end"] for s in decodes if s["t_end"] <= a), default=None)
            end_b = max((s["t_end"] for s in decodes if s["t_end"] <= b), default=None)
            if end_a is None or end_b is None:  # past the trace's last flushed line
                continue
            between = [s for s in steps if end_a < s["t_end"] <= end_b]
            print(f"  gap {1e3 * gap:.1f} ms at +{1e3 * (a - doc['sent']):.0f} ms after the doc's send: "
                  f"engine {1e3 * (end_b - end_a):.1f} ms, delivery {1e3 * (a - end_a):.1f} / "
                  f"{1e3 * (b - end_b):.1f} ms; steps between: "
                  + ", ".join(f"{s['num_prefill_tokens']}p{s['num_decode_tokens']}d "
                              f"{1e3 * (s['t_end'] - s['t_start']):.0f}ms" for s in between[:6]),
                  flush=True)
    print(f"trace: {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
