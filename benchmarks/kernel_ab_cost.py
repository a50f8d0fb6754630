"""One side of an old-build vs new-build A/B of the kernels (issue 31's cost numbers).

Default model (dtype auto), one thread, CPU time (time.process_time: other processes that
time-slice a shared host do not inflate it). Prefill of 512 / 2048 tokens whole (the per-op
path), decode at batch 1 / 32 at context 512 (the fused stack) and 96 (the per-op path; context
blocks shared by every row as in model_bench, and private blocks at context 256). Prints one line;
run it from each build in turn, alternating, e.g.

    for i in 1 2; do
      PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/kernel_ab_cost.py old
      PYTHONPATH=src .venv/bin/python benchmarks/kernel_ab_cost.py new
    done
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_bench  # noqa: E402
from cadence.core.plan import ScheduledChunk, StepPlan  # noqa: E402
from cadence.executor.model_runner import ModelExecutor  # noqa: E402
from cadence.model.loader import load_model  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("label", nargs="?", default="run", help="printed first on the line (e.g. old / new)")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)


def cpu_median(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.process_time(); fn(); times.append(time.process_time() - t)
    return statistics.median(times)

def decode_private(loaded, batch, context, repeats):
    per = context // 16 + 1
    ex = ModelExecutor(loaded, num_blocks=per * batch, block_size=16, seed=0)
    ex.kv_cache.storage.normal_(0, 1)
    chunks = tuple(ScheduledChunk(f"d{i}", (100 + i,), context, tuple(range(i * per, (i + 1) * per)), True,
                                  model_bench.GREEDY, 1, is_prefill=False) for i in range(batch))
    plan = StepPlan(0, chunks, 16)
    return cpu_median(lambda: ex.execute(plan), repeats)

model_bench.median_time = cpu_median
loaded = load_model(None, dtype="auto", device="cpu")
out = []
with torch.inference_mode():
    for n in (512, 2048):
        tps, _ = model_bench.bench_prefill(loaded, n, 3)
        out.append(f"prefill{n} {tps:.1f}")
    for b in (1, 32, 96):
        s, _ = model_bench.bench_decode(loaded, b, 512, 5)
        out.append(f"dec b{b} {b / s:.1f}")
    out.append(f"dec b96 private ctx256 {96 / decode_private(loaded, 96, 256, 5):.1f}")
print(args.label, loaded.model.decode_weight_format, " | ".join(out), flush=True)
