"""GGUFWeight.linear per GGUF type: decode (T = 1) in GB/s of weight bytes streamed, prefill
(T = 512) in GFLOP/s (2 * N * K * T), for a 2048 x 8192 and a 4096 x 4096 weight, on each kernel
tier (each in its own process: CADENCE_ISA picks the tier at load).

    .venv/bin/python benchmarks/gguf_weight_bench.py                       # every type, both tiers
    .venv/bin/python benchmarks/gguf_weight_bench.py --types Q4_K Q6_K --tiers avx2

    .venv/bin/python benchmarks/gguf_weight_bench.py --file model-Q4_K_M.gguf  # a whole file

--file: every 2-D tensor of a GGUF file as a GGUFWeight (in place in its memory map): load
seconds, process RSS before and after, then one T = 1 pass over every tensor but the embedding
(a decode step's GEMMs: GB/s over the bytes streamed).

Weights are valid random blocks (finite fp16 scales, random quant bytes): the kernels' speed does
not depend on the values. Medians over --repeats runs. Reports, never asserts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as perf_bench: idle threads sleep

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import median_time  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

from cadence.model.gguf_weight import SUPPORTED_TYPES, GGUFWeight  # noqa: E402

SHAPES = ((2048, 8192), (4096, 4096))  # (N, K)
# Byte offsets of each block's fp16 scales (random bytes elsewhere are valid quants).
HALF_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
                "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_weight(qtype: GGMLQuantizationType, N: int, K: int) -> GGUFWeight:
    rng = np.random.default_rng(0)
    if qtype.name in ("F32", "F16", "BF16"):
        values = torch.from_numpy(rng.standard_normal((N, K), dtype=np.float32) * 0.02)
        data = {"F32": values, "F16": values.half(), "BF16": values.bfloat16()}[qtype.name]
        return GGUFWeight.from_data(qtype, (N, K), data.view(torch.uint8))
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(N * K // block, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype.name]:
        data[:, offset:offset + 2] = (rng.uniform(0.002, 0.02, size=(N * K // block, 1))
                                      .astype(np.float16).view(np.uint8))
    return GGUFWeight.from_data(qtype, (N, K), data)


def bench_tier(types: list[str], repeats: int) -> None:
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    tier = kernels.kernel_tier() if kernels is not None else "torch"
    print(f"tier {tier}, {torch.get_num_threads()} threads")
    print(f"{'type':>7} {'N x K':>12} {'MiB':>7} {'T=1 us':>9} {'GB/s':>7} {'T=512 ms':>9} {'GFLOP/s':>8}")
    for name in types:
        qtype = GGMLQuantizationType[name]
        for N, K in SHAPES:
            weight = random_weight(qtype, N, K)
            x1 = torch.randn(1, K)
            x512 = torch.randn(512, K)
            decode = median_time(lambda: weight.linear(x1), repeats * 10, warmup=3)
            prefill = median_time(lambda: weight.linear(x512), repeats)
            print(f"{name:>7} {f'{N}x{K}':>12} {weight.nbytes / 2**20:7.1f} {decode * 1e6:9.0f} "
                  f"{weight.nbytes / decode / 1e9:7.1f} {prefill * 1e3:9.1f} {2 * N * K * 512 / prefill / 1e9:8.1f}",
                  flush=True)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_file(path: str, repeats: int) -> None:
    """Load every 2-D tensor of a GGUF file as a GGUFWeight, then one decode step's GEMMs."""
    import time
    from collections import Counter

    from gguf import GGUFReader

    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    tier = kernels.kernel_tier() if kernels is not None else "torch"
    rss0 = rss_mib()
    start = time.perf_counter()
    reader = GGUFReader(path)
    parsed = time.perf_counter()
    weights = {t.name: GGUFWeight.from_reader_tensor(t) for t in reader.tensors if len(t.shape) == 2}
    loaded = time.perf_counter()
    held = sum(w.nbytes for w in weights.values())
    types = Counter(w.ggml_type.name for w in weights.values())
    print(f"{path}: {len(weights)} 2-D tensors {dict(types)}, {held / 2**30:.2f} GiB held "
          f"(file {os.path.getsize(path) / 2**30:.2f} GiB); tier {tier}, {torch.get_num_threads()} threads")
    print(f"load: header {parsed - start:.1f} s, weights {loaded - parsed:.2f} s; RSS {rss0:.0f} -> {rss_mib():.0f} MiB")
    gemms = [w for name, w in weights.items() if name != "token_embd.weight"]
    xs = {w.in_features: torch.randn(1, w.in_features) for w in gemms}
    streamed = sum(w.nbytes for w in gemms)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in gemms:
            w.linear(xs[w.in_features])
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(f"decode GEMMs (T=1, {len(gemms)} tensors, {streamed / 2**30:.2f} GiB): first pass {times[0]:.2f} s, "
          f"best {best * 1e3:.0f} ms = {streamed / best / 1e9:.1f} GB/s; RSS {rss_mib():.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=[t.name for t in SUPPORTED_TYPES])
    parser.add_argument("--tiers", nargs="+", default=["auto", "avx2"],
                        help="kernel tiers (CADENCE_ISA values), each run in its own process")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--file", help="a GGUF file: load it and time one decode step's GEMMs (this tier only)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.file:
        bench_file(args.file, args.repeats)
        return
    if args.in_process:
        bench_tier(args.types, args.repeats)
        return
    for tier in args.tiers:
        env = dict(os.environ, CADENCE_ISA=tier)
        subprocess.run([sys.executable, __file__, "--in-process", "--repeats", str(args.repeats),
                        "--threads", str(args.threads), "--types", *args.types], env=env, check=True)


if __name__ == "__main__":
    main()
