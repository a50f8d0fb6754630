"""What the process split buys: ITL at N concurrent streams, engine process vs in-process.

    python -m cadence.server.frontend_cost --streams 32 --output-tokens 64 [--repeats 2]
        [--serve-arg=--dtype=float32 ...]

For each mode it starts `cadence serve` (separate engine process, or `--in-process-engine`:
the engine loop in a thread of the server process, sharing its GIL), runs `cadence bench` with
N concurrent streams (client-side timestamps of every SSE chunk), and reads the CPU time the
front-end process and the engine process used. Prints one row per run: ITL and TTFT
percentiles, output tokens/s, and front-end CPU seconds per 1000 streamed tokens (the front
end's cost; in-process mode it includes the engine, so only the separate mode isolates it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from cadence.server.proc_stat import child_pids, cpu_seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(mode: str, args: argparse.Namespace, out_dir: str) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "cadence.cli", "serve", "--port", str(port),
           "--log-level", "warning", *args.serve_arg]
    if mode == "in-process":
        cmd.append("--in-process-engine")
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server not healthy in time")
            time.sleep(0.5)
        engines = child_pids(server.pid) if mode == "separate" else []
        cpu0 = {p: cpu_seconds(p) for p in [server.pid, *engines]}
        bench_out = os.path.join(out_dir, f"{mode}-{port}")
        subprocess.run(
            [sys.executable, "-m", "cadence.cli", "bench", "--url", url, "--workload", "chat",
             "--num-requests", str(args.streams), "--arrival", "concurrency", "--concurrency",
             str(args.streams), "--output-tokens", f"{args.output_tokens}:{args.output_tokens}",
             "--short-tokens", args.prompt_tokens, "--metrics-interval", "0", "--no-progress",
             "--out", bench_out], env=env, check=True, stdout=subprocess.DEVNULL)
        cpu = {p: cpu_seconds(p) - cpu0[p] for p in cpu0}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    with open(os.path.join(bench_out, "result.json")) as f:
        metrics = json.load(f)["runs"][0]["metrics"]
    tokens = metrics["throughput"]["output_tokens"]
    return {
        "mode": mode,
        "itl": metrics["itl"],
        "ttft": metrics["ttft"],
        "output_tps": metrics["throughput"]["output_tps"],
        # A run whose requests failed measures something else: say so next to its numbers.
        "failed_requests": metrics["failures"]["count"],
        "frontend_cpu_per_1k_tokens": cpu[server.pid] / tokens * 1000 if tokens else None,
        "engine_cpu_per_1k_tokens": (sum(cpu[p] for p in engines) / tokens * 1000
                                     if tokens and engines else None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", default="32:64", help="MIN:MAX prompt tokens")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra `cadence serve` flag (repeatable), "
                        "e.g. --serve-arg=--dtype=float32")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cadence-frontend-cost-") as out_dir:
        for _ in range(args.repeats):
            for mode in ("separate", "in-process"):  # interleaved: drift hits both alike
                rows.append(run_once(mode, args, out_dir))
                print(json.dumps(rows[-1]), file=sys.stderr)

    def ms(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value * 1000:.{digits}f} ms"

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    print(f"{args.streams} concurrent streams, {args.output_tokens} output tokens each\n")
    print("| engine | ITL p50 | ITL p95 | ITL p99 | ITL max | TTFT p50 | out tok/s "
          "| front-end CPU s/1k tok | engine CPU s/1k tok | failed requests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        itl, ttft = r["itl"], r["ttft"]
        print(f"| {r['mode']} | {ms(itl['p50'])} | {ms(itl['p95'])} | {ms(itl['p99'])} | "
              f"{ms(itl['max'])} | {ms(ttft['p50'], 0)} | {r['output_tps']:.1f} | "
              f"{num(r['frontend_cpu_per_1k_tokens'])} | {num(r['engine_cpu_per_1k_tokens'])} | "
              f"{r['failed_requests']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
