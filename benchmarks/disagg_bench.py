"""Colocated chunked prefill vs 1P1D disaggregation vs the router's automatic choice.

    .venv/bin/python benchmarks/disagg_bench.py                # default model, both workloads
    .venv/bin/python benchmarks/disagg_bench.py --quick        # smaller workloads

Configurations (same model, same machine):
  colocated  `cadence serve --policy chunked` with all cores (--engine-threads = cores)
  1p1d       `cadence serve --disagg 1:1 --routing-policy always`: one prefill and one decode
             worker with an equal share of the cores each, every request handed off
  auto       the same 1P1D workers, `--routing-policy auto` (the measured cost model decides
             per request)
Workloads (`cadence bench`), in this order on the same servers of a config (the router's
measured cost model carries over, as on a server that keeps serving: serial first is a quiet
server, then the traffic grows):
  serial     the mix's first 12 prompts (a 2000-token one among them) one at a time
             (concurrency 1): never a stream to protect
  short      Poisson arrivals of short prompts only (16-128 tokens): little interference to avoid
  doc-burst  3 chat streams decoding, then 2 long documents arrive
  mix        Poisson arrivals, lognormal short/long prompt lengths (seed 1 draws prompts of 2000
             and 1107 tokens among 24; "interfered" = while a prompt of >= 1000 tokens prefilled)
Printed per run: the chat streams' max stall and ITL p99 while long prompts ran
(itl_interfered), ITL p99 over all streams, document TTFT p50/max (ttft_long), TTFT p50 over
all requests, mean end-to-end latency, output throughput, KV bytes moved and transfer ms per
handed-off request (from the workers' counters, through the router's /metrics), and the
router's decisions: counted by reason, and per request by prompt length (<64, 64-999, >=1000
tokens: handed off or colocated; the records are in <out>/<config>-<workload>/decisions.json).
The load average is printed before and after (the host may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cadence.bench.server_process import launch_cli


def start(args: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    """`cadence serve ARGS` on a free port, healthy."""
    return launch_cli(["serve", *args], log_path)


def scrape(url: str) -> dict[str, float]:
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name
            if "name" in s.labels:
                key = f"{s.labels['role']}:{s.labels['name']}"
                out[key] = out.get(key, 0.0) + s.value
                continue
            if "reason" in s.labels or "route" in s.labels:
                key = f"{s.name}[{s.labels.get('reason') or s.labels.get('route')}]"
            out[key] = s.value
    return out


def decisions_since(url: str, seq: int) -> tuple[int, list[dict]]:
    """The router's per-request decisions from `seq` on (none: not a router)."""
    try:
        resp = httpx.get(url + "/decisions", params={"since": seq}, timeout=10)
    except httpx.HTTPError:
        return seq, []
    if resp.status_code != 200:
        return seq, []
    body = resp.json()
    return body["next"], body["decisions"]


# Prompt length classes of the per-request decisions (router's token estimate).
LENGTH_CLASSES = ((0, 64, "<64"), (64, 1000, "64-999"), (1000, 10**9, ">=1000"))


def decisions_by_length(records: list[dict]) -> dict[str, dict[str, int]]:
    """{length class: {"disagg"|"coloc": count}} of one workload's requests."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        name = next(n for lo, hi, n in LENGTH_CLASSES if lo <= r["prompt_tokens"] < hi)
        route = "disagg" if r["disaggregate"] else "coloc"
        out.setdefault(name, {}).setdefault(route, 0)
        out[name][route] += 1
    return out


def run_bench(url: str, workload_args: list[str], out_dir: str) -> dict:
    cmd = [sys.executable, "-m", "cadence.cli", "bench", "--url", url, "--out", out_dir,
           *workload_args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "result.json")) as f:
        return json.load(f)["runs"][0]["metrics"]


def ms(v) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2 model")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", default="colocated,1p1d,auto")
    parser.add_argument("--workloads", default="serial,short,doc-burst,mix",
                        help="run in this order on the same servers per config")
    parser.add_argument("--budget", type=int, default=256, help="--max-num-batched-tokens")
    parser.add_argument("--out", default=None)
    parser.add_argument("--long-tokens", type=int, default=None,
                        help="document / long prompt length (default 2000, --quick 1000)")
    parser.add_argument("--stream-output", default="96:128", help="doc-burst streams' tokens")
    parser.add_argument("--num-requests", type=int, default=None, help="mix: requests")
    parser.add_argument("--rate", type=float, default=1.0, help="mix: Poisson requests/s")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="disagg-bench-")
    os.makedirs(out, exist_ok=True)
    cores = os.cpu_count() or 2
    common = ["--policy", "chunked", "--max-num-batched-tokens", str(args.budget)]
    if args.model:
        common += ["--model", args.model]
    configs = {
        "colocated": common + ["--engine-threads", str(cores)],
        "1p1d": common + ["--disagg", "1:1", "--routing-policy", "always"],
        "auto": common + ["--disagg", "1:1", "--routing-policy", "auto"],
    }
    long_tokens = str(args.long_tokens or (1000 if args.quick else 2000))
    num_requests = str(args.num_requests or (12 if args.quick else 24))
    workloads = {
        "doc-burst": ["--workload", "doc-burst", "--streams", "3", "--docs", "2",
                      "--long-tokens", long_tokens, "--output-tokens", args.stream_output,
                      "--doc-output-tokens", "16", "--doc-delay", "3", "--doc-gap", "1.5"],
        "mix": ["--workload", "mix", "--seed", "1", "--arrival", "poisson", "--rate",
                str(args.rate), "--num-requests", num_requests, "--short-tokens", "32:256",
                "--long-tokens", long_tokens, "--output-tokens", "24:64",
                "--long-prompt-tokens", str(int(long_tokens) // 2)],
        "short": ["--workload", "mix", "--seed", "2", "--arrival", "poisson", "--rate",
                  str(2 * args.rate), "--num-requests", num_requests,
                  "--short-tokens", "16:128", "--long-tokens", "128",
                  "--output-tokens", "24:64"],
        "serial": ["--workload", "mix", "--seed", "1", "--arrival", "concurrency",
                   "--concurrency", "1", "--num-requests", str(int(num_requests) // 2),
                   "--short-tokens", "32:256", "--long-tokens", long_tokens,
                   "--output-tokens", "24:64"],
    }
    rows = []
    wall = time.monotonic()
    print(f"load average before: {os.getloadavg()}", flush=True)
    for name in args.configs.split(","):
        proc, url = start(configs[name], os.path.join(out, f"{name}.log"))
        try:
            seq, _ = decisions_since(url, 0)
            for wl in args.workloads.split(","):
                before = scrape(url)
                m = run_bench(url, workloads[wl], os.path.join(out, f"{name}-{wl}"))
                time.sleep(2.5)  # one more scrape of the workers by the router
                after = scrape(url)
                seq, records = decisions_since(url, seq)
                if records:
                    with open(os.path.join(out, f"{name}-{wl}", "decisions.json"), "w") as f:
                        json.dump(records, f, indent=0)
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                transfers = delta.get("decode:cadence:kv_transfers_total", 0)
                inter = m["interference"]
                rows.append({
                    "config": name, "workload": wl,
                    "ok": f"{m['requests']['ok']}/{m['requests']['total']}",
                    "stall_max_ms": ms(inter["itl_interfered"]["max"]),
                    "itl_p99_ms": ms(inter["itl_interfered"]["p99"]),
                    "itl_p99_all_ms": ms(m["itl"]["p99"]),
                    "doc_ttft_p50_ms": ms(inter["ttft_long"]["p50"]),
                    "doc_ttft_max_ms": ms(inter["ttft_long"]["max"]),
                    "ttft_p50_ms": ms(m["ttft"]["p50"]),
                    "e2e_mean_ms": ms(m["e2e"]["mean"]),
                    "out_tok_s": f"{m['throughput']['output_tps']:.1f}",
                    "handoffs": int(transfers),
                    "kv_MB_per_req": (f"{delta.get('decode:cadence:kv_transfer_bytes_total', 0) / transfers / 1e6:.2f}"
                                      if transfers else "-"),
                    "xfer_ms_per_req": (f"{1000 * delta.get('decode:cadence:kv_transfer_seconds_total', 0) / transfers:.1f}"
                                        if transfers else "-"),
                    "decisions": {k.split("[", 1)[1][:-1]: int(v) for k, v in delta.items()
                                  if k.startswith("cadence_router:decisions_total[") and v},
                    "by_length": decisions_by_length(records),
                })
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"load average after: {os.getloadavg()}; wall {time.monotonic() - wall:.0f} s")
    keys = [k for k in rows[0] if k not in ("decisions", "by_length")]
    print(" | ".join(keys) + " | decisions | by prompt length")
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys) + f" | {r['decisions']} | {r['by_length']}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"(results in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
