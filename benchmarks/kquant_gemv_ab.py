"""One side of an old-tree vs new-tree A/B of the repacked K-quants' decode GEMV (T = 1), one
thread: per type and (N, K), the median seconds of GGUFWeight.linear over enough distinct random
weights (rotated) that they stream from memory, not from the L3, as a decode step's do. Prints one
line per (type, shape) with the label; run each tree in turn, alternating, on each tier:

    for i in 1 2 3; do for isa in native avx2; do
      CADENCE_ISA=$isa PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/kquant_gemv_ab.py old
      CADENCE_ISA=$isa PYTHONPATH=src .venv/bin/python benchmarks/kquant_gemv_ab.py new
    done; done

(CADENCE_ISA=native is not a tier name: unset it, or give the tier, for the best tier.)
Weights are valid random blocks (finite fp16 scales, random quant bytes: the speed does not depend
on the values). Reports, never asserts.
"""
import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from cadence.model.gguf_weight import GGUFWeight
from cadence.model.kernels.cpu_ops import load_cpu_kernels

HALF_OFFSETS = {"Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fp16 d (and dmin)

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("label", help="printed first on each line (e.g. old / new)")
parser.add_argument("--types", nargs="+", default=list(HALF_OFFSETS))
parser.add_argument("--shapes", nargs="+", default=["2048x2048", "8192x2048"], help="N x K")
parser.add_argument("--stream-mib", type=float, default=96.0, help="bytes of distinct weights rotated per shape")
parser.add_argument("--calls", type=int, default=300)
args = parser.parse_args()

torch.set_num_threads(1)
kernels = load_cpu_kernels()
tier = kernels.kernel_tier() if kernels is not None else "torch"
rng = np.random.default_rng(0)


def random_weight(name: str, N: int, K: int) -> GGUFWeight:
    qtype = GGMLQuantizationType[name]
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(N * K // block, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[name]:
        data[:, offset:offset + 2] = (rng.uniform(0.002, 0.02, size=(N * K // block, 1))
                                      .astype(np.float16).view(np.uint8))
    return GGUFWeight.from_data(qtype, (N, K), data)


with torch.inference_mode():
    for shape in args.shapes:
        N, K = map(int, shape.split("x"))
        for name in args.types:
            first = random_weight(name, N, K)
            weights = [first] + [random_weight(name, N, K)
                                 for _ in range(max(0, int(args.stream_mib * 2**20 / first.nbytes) - 1))]
            x = torch.randn(1, K)
            for w in weights:  # warm up: first touches, the kernels' one-time setup
                w.linear(x)
            times = []
            for i in range(args.calls):
                w = weights[i % len(weights)]
                t = time.perf_counter()
                w.linear(x)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            print(f"{args.label} {tier} {name} {shape} {med * 1e6:.1f} us {first.nbytes / med / 1e9:.2f} GB/s",
                  flush=True)
