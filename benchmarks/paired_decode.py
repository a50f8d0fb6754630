"""cadence's decode of llama-bench's tg workload, paired with llama-bench round by round, per tier.

llama-bench's tg128 times 128 one-token decodes from an empty context (positions 0..127, mean
depth ~64); scale_bench.py's decode b1 row is one step at context 512, and ran minutes away from
its llama-bench number on a host whose memory bandwidth moved by 2x between minutes. Here each
round runs, back to back on the same file and threads:
  * cadence: the exact tg workload through the engine `cadence serve` decodes with (LLM with
    default settings; tg_worker.py: a one-token prompt, then greedy steps until N tokens; with
    --depths D also a D-token prompt computed untimed, then N timed decode steps), in a
    long-lived child process per kernel tier (the tier is chosen at import: CADENCE_ISA);
  * llama-bench `-m FILE -p 0 -n N -t T -r 1 [-d 0,D]`: llama.cpp's own native build whatever
    cadence's tier (its CPU backend picks its kernels from the CPU itself), or with
    --llamacpp match its AVX2-only build against cadence's avx2 tier (both sides as a CPU
    without AVX-512 runs them; llamacpp_peer.py --build-avx2);
and prints each round's tok/s and ratio cadence / llama.cpp, the load average, and the median
ratio over the rounds. cadence's tok/s counts the wall time of the N engine steps (scheduler,
executor, sampling, detokenization; no HTTP), with the executor's share beside it.

    CADENCE_LLAMACPP_CACHE=/work/cache/llamacpp .venv/bin/python benchmarks/paired_decode.py \\
        --model /work/cache/shapes/llama-3.2-1b-random-Q4_K_M.gguf --tiers native avx2 --rounds 4
    ... --model llama-3.1-8b-random-Q4_K_M.gguf --n 32 --depths 0 --rounds 2 --no-startup-profile

Reports, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llamacpp_peer

HERE = Path(__file__).resolve().parent


class TgChild:
    """tg_worker.py in its own process with one kernel tier (native: CADENCE_ISA unset)."""

    def __init__(self, model: str, threads: int, tier: str, startup_profile: bool):
        env = dict(os.environ)
        env.pop("CADENCE_ISA", None)
        if tier != "native":
            env["CADENCE_ISA"] = tier
        cmd = [sys.executable, str(HERE / "tg_worker.py"), "--model", model, "--threads", str(threads)]
        if not startup_profile:
            cmd.append("--no-startup-profile")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tg_worker exited (code {self.proc.wait()})")
        return json.loads(line)

    def run(self, n: int, depth: int, batch: int = 1) -> dict:
        self.proc.stdin.write(json.dumps({"n": n, "depth": depth, "batch": batch}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} {five:.2f}"


def tg_key(n: int, depth: int) -> str:
    """llamacpp_peer.llama_bench's key of a tg test."""
    return f"tg{n}" + (f"@d{depth}" if depth else "")


def peer_variant(args, tier: str) -> str:
    """The llama.cpp build paired with a cadence tier."""
    return "avx2" if args.llamacpp == "match" and tier == "avx2" else "native"


def pair_tier(args, tier: str) -> dict[str, list[float]]:
    """Rounds of cadence (this tier) then llama-bench; the ratios per workload key."""
    t0 = time.perf_counter()
    child = TgChild(args.model, args.threads, tier, not args.no_startup_profile)
    print(f"[{tier}] cadence ready in {time.perf_counter() - t0:.1f} s ("
          f"{child.ready['fast_path']}); llama.cpp: its {peer_variant(args, tier)} build; {load()}", flush=True)
    ratios: dict[str, list[float]] = {tg_key(args.n, d): [] for d in args.depths}
    try:
        for r in range(args.rounds):
            ours = {d: child.run(args.n, d) for d in args.depths}
            peer = llamacpp_peer.llama_bench(args.model, args.threads, f"tg{args.n}", repetitions=1,
                                             depths=tuple(args.depths), variant=peer_variant(args, tier))
            if isinstance(peer, str):
                print(f"llama-bench failed: {peer}")
                return ratios
            for d in args.depths:
                key = tg_key(args.n, d)
                run = ours[d]
                tok_s = args.n / run["seconds"]
                ratios[key].append(tok_s / peer[key])
                steps_ms = [s * 1e3 for s in run["step_s"]]
                executor_ms = sum(run["executor_s"]) * 1e3 / len(run["executor_s"])
                print(f"[{tier}] round {r + 1} {key:<10} cadence {tok_s:6.2f} tok/s (step mean "
                      f"{statistics.fmean(steps_ms):6.1f} ms, median {statistics.median(steps_ms):6.1f}, "
                      f"executor {executor_ms:6.1f}, solo {run.get('solo_steps', 0)}) vs llama.cpp {peer[key]:6.2f} tok/s: "
                      f"{ratios[key][-1]:.3f}x; {load()}", flush=True)
    finally:
        child.close()
    for key, v in ratios.items():
        if v:
            print(f"[{tier}] median of {len(v)} rounds, {key}: cadence / llama.cpp {statistics.median(v):.3f}x "
                  f"(rounds {', '.join(f'{x:.3f}' for x in v)})", flush=True)
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=128, help="tokens generated per run (llama-bench -n), both sides")
    p.add_argument("--depths", type=int, nargs="+", default=[0],
                   help="context tokens before the timed decodes (llama-bench -d), both sides")
    p.add_argument("--tiers", nargs="+", default=["native"], choices=("native", "avx512", "avx2"),
                   help="cadence's kernel tiers, each in its own child process (CADENCE_ISA)")
    p.add_argument("--llamacpp", choices=("native", "match"), default="native",
                   help="llama.cpp's build: its native one for every tier, or 'match': the AVX2-only "
                        "build (llamacpp_peer.py --build-avx2) against cadence's avx2 tier")
    p.add_argument("--no-startup-profile", action="store_true",
                   help="the engine skips its startup profile (saves ~30 s at 8B; a single stream's "
                        "decode does not depend on it)")
    args = p.parse_args(argv)
    for variant in {peer_variant(args, tier) for tier in args.tiers}:
        if llamacpp_peer.binary("llama-bench", variant) is None:
            print(f"llama.cpp's {variant} build is missing (benchmarks/llamacpp_peer.py "
                  f"{'--build-avx2' if variant == 'avx2' else '--build'}, or CADENCE_LLAMACPP_CACHE)")
            return 1
    print(f"{os.path.basename(args.model)}, {args.threads} threads, n {args.n}, depths {args.depths}; "
          f"{load()}", flush=True)
    for tier in args.tiers:
        pair_tier(args, tier)
    print(f"end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
