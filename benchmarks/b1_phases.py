"""Where a GGUF-native decode b1 step goes: the fused stack's phases in the engine against the
same GEMVs called alone, bytes per second per phase (issue 30's b1 point).

One process, one kernel tier (CADENCE_ISA), the model loaded by `LLM` with default settings:
  1. in the engine: a one-token prompt, then --steps greedy decode steps (after --warmup), each
     step's wall time, executor time and the stack's thread-0 phase clock
     (`DecodeStackGGUF.phase_seconds`: qkv, rope, attention, o, norm, gate_up, down, norm, head);
     and per thread its start, its time in the stack and its barrier waits per phase;
  2. the GEMV set alone: the same weights through the per-op kernels (`GGUFWeight.linear_many`:
     q/k/v together, gate/up together, o, down, the head), one row, layer by layer as a step
     reads them, --passes passes; each phase's calls timed one by one (so ~5-10 us of Python per
     call is in these numbers: 2 ms at 16 layers x 4 calls + the head is an upper bound on that);
  3. the engine's Python around the stack: perf_counter spans around the step's pieces (schedule,
     inputs, embedding, rope rows, the stack call, sampling, observe_step, finish and its parts),
     --steps more steps with the spans in place (each span adds ~1 us), medians per step;
  4. how much of the weights' memory is on transparent huge pages (/proc/self/smaps: the
     AnonHugePages of the mappings each weight's bytes lie in, counted once per mapping).
Bytes per phase are what the GEMMs read (the repacked octets, or the blocks). Reports, never asserts.

    /work/notes/cpu_excl .venv/bin/python benchmarks/b1_phases.py --model FILE
    CADENCE_ISA=avx2 ... (the AVX2 tier)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server runs (cadence/__init__.py)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from cadence.executor import model_runner  # noqa: E402

from cadence.core.sampling_params import SamplingParams  # noqa: E402
from cadence.engine.llm import LLM  # noqa: E402
from cadence.model.gguf_stack import _projections  # noqa: E402
from cadence.model.gguf_weight import GGUFWeight  # noqa: E402
from cadence.model.kernels.isa import describe  # noqa: E402

PHASES = ("qkv", "rope", "attention", "o", "norm", "gate_up", "down", "norm2", "head")
GEMV_PHASES = {"qkv": (0, 1, 2), "o": (3,), "gate_up": (4, 5), "down": (6,)}  # indices into _projections


def weight_bytes(w: GGUFWeight) -> int:
    """Bytes a GEMV reads: the repacked octets and any row-wise rest."""
    if w.packed is None:
        return w.blocks.numel()
    return w.packed.numel() + (w.out_features % 8) * w.blocks.shape[1] * (w.row_order is None)


def huge_page_share(tensors: list[torch.Tensor]) -> tuple[int, int]:
    """(bytes of the mappings holding these tensors, AnonHugePages of those mappings)."""
    maps = []
    with open("/proc/self/smaps") as f:
        current = None
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                current = [lo, hi, 0]
                maps.append(current)
            elif head == "AnonHugePages:" and current is not None:
                current[2] = int(line.split()[1]) * 1024
    hit = {}
    for t in tensors:
        p = t.data_ptr()
        for m in maps:
            if m[0] <= p < m[1]:
                hit[m[0]] = m
                break
    return sum(m[1] - m[0] for m in hit.values()), sum(m[2] for m in hit.values())


def engine_phases(llm: LLM, steps: int, warmup: int):
    engine = llm.engine
    model = engine.executor.model
    params = SamplingParams(temperature=0.0, max_tokens=steps + warmup + 1, ignore_eos=True)
    engine.add_request("p", [1], params)
    walls, execs, phases, threads = [], [], [], []
    start = time.perf_counter()
    n = 0
    while engine.has_unfinished():
        engine.step()
        now = time.perf_counter()
        n += 1
        if n > warmup + 1:  # the prefill step and the warmup steps untimed
            walls.append(now - start)
            execs.append(engine.last_executed[1])
            phases.append(model._decode_stack.phase_seconds())
            threads.append(model._decode_stack.thread_seconds())
        start = now
    return walls, execs, phases, threads


def print_thread_balance(threads) -> None:
    """Per thread, medians over the steps: its start after thread 0, its busy and barrier time in
    the stack, and its barrier time per phase (a thread that waits finished its share early)."""
    team = min(len(t) for t in threads)
    print(f"threads (median over steps, ms): {'start':>6} {'in stack':>9} {'waits':>6}  waits per phase "
          f"({', '.join(PHASES)})")
    for tid in range(team):
        start = statistics.median(t[tid][0] for t in threads)
        wall = statistics.median(sum(t[tid][1]) for t in threads)
        wait = statistics.median(sum(t[tid][2]) for t in threads)
        per_phase = [statistics.median(t[tid][2][p] for t in threads) for p in range(len(PHASES))]
        print(f"  thread {tid}: {start * 1e3:20.3f} {wall * 1e3:9.2f} {wait * 1e3:6.2f}  "
              f"{' '.join(f'{w * 1e3:.3f}' for w in per_phase)}")


class Spans:
    """perf_counter spans around methods of live objects (wrap), summed per step (end_step);
    restore() puts the originals back."""

    def __init__(self):
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self._undo: list = []

    def timed(self, fn, label):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.current[label] = self.current.get(label, 0.0) + time.perf_counter() - t
        return wrapper

    def wrap(self, obj, name: str, label: str) -> None:
        had = name in vars(obj)
        old = vars(obj)[name] if had else None
        setattr(obj, name, self.timed(getattr(obj, name), label))
        self._undo.append((obj, name, had, old))

    def wrap_classmethod(self, cls, name: str, label: str) -> None:
        old = vars(cls)[name]
        setattr(cls, name, staticmethod(self.timed(getattr(cls, name), label)))
        self._undo.append((cls, name, True, old))

    def end_step(self) -> None:
        self.steps.append(self.current)
        self.current = {}

    def restore(self) -> None:
        for obj, name, had, old in reversed(self._undo):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        self._undo.clear()


class _TimedStack:
    """The fused stack with its forward timed (everything else passed through)."""

    def __init__(self, stack, spans: Spans):
        self._stack = stack
        self.forward = spans.timed(stack.forward, "stack call")

    def __getattr__(self, name):
        return getattr(self._stack, name)


SPAN_ORDER = ("step", "schedule", "execute", "inputs", "forward_logits", "embed", "rope rows", "stack call",
              "sample", "observe_step", "finish", "update", "outputs", "record_step", "stats")


def engine_spans(llm: LLM, steps: int, warmup: int) -> None:
    """Spans around a b1 step's pieces (module docstring, 3.), medians per step in ms, nested
    spans indented under the one that holds them; 'Python' is the step less the stack call."""
    engine = llm.engine
    model = engine.executor.model
    spans = Spans()
    spans.wrap(engine, "step", "step")
    spans.wrap(engine.scheduler, "schedule", "schedule")
    spans.wrap(engine.executor, "execute", "execute")
    spans.wrap_classmethod(model_runner.ModelInputs, "from_plan", "inputs")
    spans.wrap(model, "forward_logits", "forward_logits")
    spans.wrap(model, "_embed", "embed")
    spans.wrap(model, "_rope_tables", "rope rows")
    spans.wrap(model_runner, "sample", "sample")
    spans.wrap(engine.scheduler, "observe_step", "observe_step")
    spans.wrap(engine, "_finish_step", "finish")
    spans.wrap(engine.scheduler, "update", "update")
    spans.wrap(engine, "_output_for", "outputs")
    spans.wrap(engine.telemetry, "record_step", "record_step")
    spans.wrap(engine.scheduler, "stats", "stats")
    stack = model._decode_stack
    model._decode_stack = _TimedStack(stack, spans)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=steps + warmup + 1, ignore_eos=True)
        engine.add_request("spans", [1], params)
        n = 0
        while engine.has_unfinished():
            engine.step()
            n += 1
            if n <= warmup + 1:
                spans.current = {}
            else:
                spans.end_step()
    finally:
        model._decode_stack = stack
        spans.restore()
    med = {k: statistics.median(s.get(k, 0.0) for s in spans.steps) for k in SPAN_ORDER}
    nested = {"inputs", "forward_logits", "sample", "update", "outputs", "record_step", "stats"}
    deeper = {"embed", "rope rows", "stack call"}
    print(f"engine spans, median per step over {len(spans.steps)} steps (ms):")
    for k in SPAN_ORDER:
        indent = 6 if k in deeper else 4 if k in nested else 2
        print(f"{' ' * indent}{k:<{24 - indent}} {med[k] * 1e3:7.3f}")
    python = statistics.median(s["step"] - s.get("stack call", 0.0) for s in spans.steps)
    print(f"  Python (step less the stack call) {python * 1e3:.3f} ms")


def gemv_alone(model, passes: int):
    layers = model.model.layers
    weights = [[lin.gguf_weight for lin in _projections(layer)] for layer in layers]
    head = model.lm_head.gguf_weight
    H = model.config.hidden_size
    inputs = {"qkv": torch.randn(1, H), "o": torch.randn(1, weights[0][3].in_features),
              "gate_up": torch.randn(1, H), "down": torch.randn(1, weights[0][6].in_features)}
    totals = {name: [] for name in (*GEMV_PHASES, "head")}
    with torch.inference_mode():
        for _ in range(passes + 1):  # the first pass untimed
            sums = dict.fromkeys(totals, 0.0)
            for ws in weights:
                for name, idx in GEMV_PHASES.items():
                    group = [ws[i] for i in idx]
                    t = time.perf_counter()
                    GGUFWeight.linear_many(group, inputs[name])
                    sums[name] += time.perf_counter() - t
            t = time.perf_counter()
            head.linear(inputs["qkv"])
            sums["head"] = time.perf_counter() - t
            for name in totals:
                totals[name].append(sums[name])
    return {name: statistics.median(v[1:]) for name, v in totals.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="/work/cache/shapes/llama-3.2-1b-random-Q4_K_M.gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--passes", type=int, default=8)
    p.add_argument("--no-thp", action="store_true",
                   help="PR_SET_THP_DISABLE first: this process gets no transparent huge pages, as on a host "
                        "whose THP setting is `never`")
    args = p.parse_args()
    if args.no_thp:
        ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
    torch.set_num_threads(args.threads)
    llm = LLM(args.model, startup_profile=False)
    model = llm.engine.executor.model
    print(f"{describe()}; load {os.getloadavg()[0]:.2f}", flush=True)
    walls, execs, phases, threads = engine_phases(llm, args.steps, args.warmup)
    layers = model.model.layers
    ws = [[lin.gguf_weight for lin in _projections(layer)] for layer in layers]
    head = model.lm_head.gguf_weight
    nbytes = {name: sum(weight_bytes(w[i]) for w in ws for i in idx) for name, idx in GEMV_PHASES.items()}
    nbytes["head"] = weight_bytes(head)
    med = [statistics.median(s[i] for s in phases) for i in range(len(PHASES))]
    print(f"engine step median {statistics.median(walls) * 1e3:.2f} ms, executor {statistics.median(execs) * 1e3:.2f},"
          f" stack phases sum {sum(med) * 1e3:.2f} ms (median per phase)")
    print_thread_balance(threads)
    parts = model._decode_stack.thread_parts(args.threads)
    print(f"GEMV parts now (ThreadSplit bounds; CADENCE_THREAD_SPLIT={os.environ.get('CADENCE_THREAD_SPLIT', 'fit')}):"
          f" {' '.join(f'{b:.3f}' for b in parts)}")
    engine_spans(llm, args.steps, args.warmup)
    alone = gemv_alone(model, args.passes)
    print(f"{'phase':>10} {'in stack ms':>12} {'GB/s':>7} {'alone ms':>9} {'GB/s':>7} {'MB':>7}")
    for name, sec in zip(PHASES, med):
        if name in nbytes:
            b = nbytes[name]
            print(f"{name:>10} {sec * 1e3:12.2f} {b / sec / 1e9:7.1f} {alone[name] * 1e3:9.2f} "
                  f"{b / alone[name] / 1e9:7.1f} {b / 1e6:7.1f}")
        else:
            print(f"{name:>10} {sec * 1e3:12.2f}")
    total_b = sum(nbytes.values())
    gemv_stack = sum(med[PHASES.index(n)] for n in nbytes)
    print(f"GEMVs: {total_b / 1e6:.0f} MB, in stack {gemv_stack * 1e3:.2f} ms ({total_b / gemv_stack / 1e9:.1f} GB/s),"
          f" alone {sum(alone.values()) * 1e3:.2f} ms ({total_b / sum(alone.values()) / 1e9:.1f} GB/s)")
    for label, tensors in (("layers' packed", [w.packed for l in ws for w in l if w.packed is not None]),
                           ("q/k/v/o packed", [w.packed for l in ws for w in l[:4] if w.packed is not None]),
                           ("head packed", [head.packed] if head.packed is not None else [])):
        mapped, huge = huge_page_share(tensors)
        print(f"huge pages, {label}: {huge / 1e6:.0f} of {mapped / 1e6:.0f} MB mapped")
    big = torch.ones(128 << 20)  # 512 MB of float32 (perf_bench's plain read)
    reads = []
    for _ in range(5):
        t = time.perf_counter()
        big.sum()
        reads.append(time.perf_counter() - t)
    print(f"plain read (torch sum of 512 MB, {args.threads} threads, best of 5): {big.nbytes / min(reads) / 1e9:.1f} GB/s")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
