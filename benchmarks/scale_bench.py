"""cadence at real model sizes next to llama.cpp on the same GGUF file, same threads, same run.

For one GGUF file (benchmarks/gguf_shapes.py makes random-weight files of the 1B-8B shapes),
loaded with default settings (`--quantization auto`: a Q4_K_M file computes on its own blocks,
model/gguf_native.py), one run prints:
  * this machine's memory read bandwidth, float32 GEMM rate and int8 dot-product peak, measured
    in the run (the peak: the kernel tier's own integer dot-product instructions in a tight
    in-register loop on every thread, `int8_dot_peak`: vpdpbusd on AVX512-VNNI, maddubs + int16
    adds on AVX2; 2 FLOPs per byte product);
  * cadence decode at batch 1 / 8 / 32 and contexts 512 / 4096 (one step, forward + greedy
    sample, tok/s = batch / median step time) with its share of the roofline floor
    max(byte floor, FLOP floor): the byte floor is the bytes a step must read (the layers' and
    the head's GGUF weights as the kernels read them, plus every sequence's KV) over the
    bandwidth; the FLOP floor is the GEMM FLOPs at the int8 peak where the weights are quantized
    (the arithmetic the kernels do; at the float32 GEMM rate for float weights) plus the
    attention FLOPs at the float32 GEMM rate (attention computes in float32);
  * cadence prefill of 512 and 2048 tokens (one prompt, logits of its last row), with its share
    of the FLOP floor, as decode's;
  * llama-bench pp512 / tg128 on the same file with the same threads, in every round, each
    right after cadence's prefill 512 / decode b1 ctx512 (the same minute of a shared host):
    cadence / llama.cpp per round and the median.

Each sequence has its own KV blocks, scattered (shuffled ids) as a real pool ends up, unless
batch x context x KV bytes exceeds --kv-budget-gib: then the sequences share one context's
blocks (marked "shared ctx": the attention reads the same pages, fewer bytes than the floor
counts, so that row's share is optimistic).

    CADENCE_LLAMACPP_CACHE=/work/cache/llamacpp .venv/bin/python benchmarks/scale_bench.py \
        --model /work/cache/shapes/llama-3.2-1b-random-Q4_K_M.gguf --rounds 2
    CADENCE_ISA=avx2 ...  (the AVX2 kernel tier; llama.cpp stays the native build)

Timings on shared cores are noisy: read the ratios of one round, and the load average printed;
--quiet-load waits for a quiet minute before each round. Each row also gives the process's CPU
seconds per step (all threads): what the step costs on busy cores, whatever the neighbours do.
Reports, never asserts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server runs (cadence/__init__.py)

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

import llamacpp_peer  # noqa: E402
from perf_bench import BLOCK_SIZE, GREEDY, Machine, measure_machine  # noqa: E402

from cadence.core.plan import ScheduledChunk, StepPlan  # noqa: E402
from cadence.executor.model_runner import ModelExecutor  # noqa: E402
from cadence.model.config import ModelConfig  # noqa: E402
from cadence.model.gguf_modules import GGUFLinear  # noqa: E402
from cadence.model.kernels.cpu_ops import load_cpu_kernels  # noqa: E402
from cadence.model.kernels.isa import describe  # noqa: E402
from cadence.model.kv_cache import kv_bytes_per_block, loaded_kv_cache_dtype  # noqa: E402
from cadence.model.loader import LoadedModel, load_model  # noqa: E402


def streamed_weight_bytes(loaded: LoadedModel) -> int:
    """Bytes of weights one decode step reads: every linear's weight as the kernels read it
    (GGUF blocks or their repacked copy), each shared weight once; the embedding's rows are
    looked up, not streamed."""
    seen: dict[int, int] = {}
    for module in loaded.model.modules():
        if isinstance(module, GGUFLinear):
            seen[id(module.gguf_weight)] = module.gguf_weight.nbytes
        elif isinstance(module, torch.nn.Linear) and module.weight.numel():
            seen[id(module.weight)] = module.weight.numel() * module.weight.element_size()
    return sum(seen.values())


def matmul_params(c: ModelConfig) -> int:
    per_layer = c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
    return c.num_layers * (per_layer + 3 * c.hidden_size * c.intermediate_size)


def prefill_flops(c: ModelConfig, n: int) -> float:
    """GEMMs of n tokens, causal attention (half the pairs, QK^T and PV), one logits row."""
    return prefill_gemm_flops(c, n) + prefill_attention_flops(c, n)


def prefill_gemm_flops(c: ModelConfig, n: int) -> float:
    return 2 * matmul_params(c) * n + 2 * c.hidden_size * c.vocab_size


def prefill_attention_flops(c: ModelConfig, n: int) -> float:
    return 2 * 2 * c.num_layers * c.q_size * n * n / 2


@dataclass(frozen=True)
class Peaks:
    """The compute rates a floor divides FLOPs by (FLOP/s, measured in the run)."""

    gemm: float       # the GEMMs' arithmetic: int8 dot products for quantized weights, else float32
    attention: float  # float32 (the attention kernels compute in float32)
    gemm_kind: str

    def seconds(self, gemm_flops: float, attention_flops: float) -> float:
        return gemm_flops / self.gemm + attention_flops / self.attention


def quantized_gemms(loaded: LoadedModel) -> bool:
    """Whether the layers' GEMMs run on integer dot products (quantized GGUF blocks, or int8 /
    int4 packed weights)."""
    floats = {"F32", "F16", "BF16"}
    types = {m.gguf_weight.ggml_type.name for m in loaded.model.modules() if isinstance(m, GGUFLinear)}
    if types:
        return not types <= floats
    return str(loaded.model.decode_weight_format) in ("int8", "int4")


def int8_peak_flops() -> float | None:
    """FLOP/s of the kernel tier's int8 dot-product micro kernel on this run's threads (best of 3)."""
    kernels = load_cpu_kernels()
    if kernels is None or not hasattr(kernels, "int8_dot_peak"):
        return None
    return max(kernels.int8_dot_peak(4_000_000) for _ in range(3))


def kv_bytes_per_token(loaded: LoadedModel, kv_dtype: torch.dtype) -> int:
    return kv_bytes_per_block(loaded.config, 1, kv_dtype)


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall seconds, mean process CPU seconds) of fn() over `repeats` runs after one
    warm-up. The CPU seconds (all threads) say what a step costs whatever the neighbours do: on
    a loaded host the wall time stretches, the CPU time much less (idle threads sleep)."""
    fn()
    walls = []
    cpu0 = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), (time.process_time() - cpu0) / repeats


# The fused stacks' phases (thread 0's wall seconds per phase; barrier waits count to the phase
# before them): DecodeStackGGUF's 9, the LM head last.
STACK_PHASES = ("qkv", "rope", "attention", "o", "norm", "gate_up", "down", "norm2", "head")


def phase_flops(c: ModelConfig, batch: int, context: int) -> dict[str, tuple[float, float]]:
    """Per stack phase with arithmetic: (GEMM FLOPs, attention FLOPs) of one decode step."""
    L, H, I = c.num_layers, c.hidden_size, c.intermediate_size
    return {"qkv": (2 * batch * L * H * (c.q_size + 2 * c.kv_size), 0.0),
            "attention": (0.0, 2 * 2 * batch * L * c.q_size * context),
            "o": (2 * batch * L * c.q_size * H, 0.0),
            "gate_up": (2 * batch * L * 2 * H * I, 0.0),
            "down": (2 * batch * L * I * H, 0.0),
            "head": (2 * batch * c.vocab_size * H, 0.0)}


def stack_phases(loaded: LoadedModel) -> tuple[list[float], int] | None:
    """The fused stack's last step: thread 0's seconds per phase and its team size (None
    without a stack)."""
    stack = getattr(loaded.model, "_decode_stack", None)
    if not stack or not hasattr(stack, "phase_seconds"):
        return None
    return list(stack.phase_seconds()), int(stack.last_team)


def decode_step_s(loaded: LoadedModel, batch: int, context: int, steps: int,
                  kv_budget: float, kv_dtype: torch.dtype,
                  phases: list | None = None) -> tuple[float, float, bool]:
    """(median wall seconds, CPU seconds of one decode step of `batch` sequences at `context`
    over a KV cache stored in kv_dtype, shared context). `phases`: gets each timed step's
    stack_phases()."""
    shared = batch * context * kv_bytes_per_token(loaded, kv_dtype) > kv_budget
    per_seq = context // BLOCK_SIZE + 1
    if shared:  # one context's blocks read by all, a private last block each for the new K/V
        ctx_blocks = context // BLOCK_SIZE
        num_blocks = ctx_blocks + batch
        tables = [tuple(range(ctx_blocks)) + (ctx_blocks + i,) for i in range(batch)]
    else:
        num_blocks = batch * per_seq
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
        tables = [tuple(order[i * per_seq:(i + 1) * per_seq]) for i in range(batch)]
    executor = ModelExecutor(loaded, num_blocks=num_blocks, block_size=BLOCK_SIZE, seed=0, kv_dtype=kv_dtype)
    executor.kv_cache.storage.normal_(0, 1)
    chunks = tuple(ScheduledChunk(f"d{i}", (100 + i,), context, tables[i], True, GREEDY, 1, is_prefill=False)
                   for i in range(batch))
    def step():
        executor.execute(StepPlan(0, chunks, BLOCK_SIZE))
        if phases is not None:
            phases.append(stack_phases(loaded))
    wall, cpu = timed(step, steps)
    if phases:
        del phases[0]  # the warm-up's
    del executor
    return wall, cpu, shared


def prefill_s(loaded: LoadedModel, n: int, repeats: int, kv_dtype: torch.dtype) -> tuple[float, float]:
    """(median wall seconds, CPU seconds) of one n-token prompt's prefill."""
    blocks = -(-n // BLOCK_SIZE)
    executor = ModelExecutor(loaded, num_blocks=blocks, block_size=BLOCK_SIZE, seed=0, kv_dtype=kv_dtype)
    ids = tuple(torch.randint(3, loaded.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist())
    chunk = ScheduledChunk("p", ids, 0, tuple(range(blocks)), True, GREEDY, 0)
    return timed(lambda: executor.execute(StepPlan(0, (chunk,), BLOCK_SIZE)), repeats)


def wait_for_quiet(max_load: float, max_wait_s: float) -> None:
    """Wait (at most max_wait_s) until the 1-minute load average is below max_load."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5)


def cpu_line() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    wanted = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                          "avx_vnni") if f in flags]
    return (f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs, "
            f"L2 {fields.get('L2 cache', '?').strip()}, L3 {fields.get('L3 cache', '?').strip()}, flags {' '.join(wanted)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--prompt-lens", type=int, nargs="*", default=[512, 2048],
                   help="prefill lengths (none given: decode rows only)")
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps per row and round (median)")
    p.add_argument("--prefill-repeats", type=int, default=1)
    p.add_argument("--kv-budget-gib", type=float, default=4.0,
                   help="above this much KV a decode row shares one context's blocks")
    p.add_argument("--kv-cache-dtype", nargs="+", default=["auto"],
                   choices=("auto", "float32", "float16", "bfloat16"),
                   help="the decode rows' KV cache dtype; several: each decode row once per dtype, "
                        "side by side (prefill rows and llama.cpp's use the first)")
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--tg", type=int, default=128,
                   help="llama-bench's generated tokens (tg128; fewer for a quick 8B run on a loaded host)")
    p.add_argument("--phases", action="store_true",
                   help="after each decode row: the fused stack's thread-0 time per phase (median over the "
                        "steps), the team size, and each phase's own floor (its FLOPs at the peaks)")
    p.add_argument("--quiet-load", type=float, default=0.0,
                   help="before each round, wait until the 1-minute load average is below this (0: never)")
    p.add_argument("--quiet-wait-s", type=float, default=600.0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"CPU: {cpu_line()}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {args.threads} threads; "
          f"CADENCE_ISA={os.environ.get('CADENCE_ISA', '(native)')}")
    machine: Machine = measure_machine(3, (torch.float32,))
    gemm = machine.gemm_flops[torch.float32]
    int8_peak = int8_peak_flops()
    print(f"measured: memory read {machine.bandwidth / 1e9:.1f} GB/s, float32 GEMM {gemm / 1e9:.0f} GFLOP/s, "
          f"int8 dot-product peak {int8_peak / 1e9 if int8_peak else float('nan'):.0f} GFLOP/s")
    start = time.perf_counter()
    loaded = load_model(args.model, dtype="auto", device="cpu", quantization="auto")
    c = loaded.config
    weights = streamed_weight_bytes(loaded)
    on_int8 = quantized_gemms(loaded) and int8_peak is not None
    peaks = Peaks(int8_peak if on_int8 else gemm, gemm, "int8 peak" if on_int8 else "float32 GEMM")
    print(f"cadence: {os.path.basename(args.model)}, {loaded.model.decode_weight_format} weights "
          f"({weights / 2**20:.0f} MiB read per decode step), {describe()}, loaded in {time.perf_counter() - start:.1f} s")
    if not args.no_llamacpp and llamacpp_peer.binary("llama-bench") is None:
        print("llama.cpp is not built (benchmarks/llamacpp_peer.py --build, or CADENCE_LLAMACPP_CACHE)")
        args.no_llamacpp = True
    budget = args.kv_budget_gib * 2**30
    kv_dtypes = [loaded_kv_cache_dtype(name, loaded) for name in args.kv_cache_dtype]
    ratios: dict[str, list[float]] = {}
    def peer(test: str) -> float | None:
        """llama-bench's tok/s for one test (pp512 / tg128) on the same file and threads."""
        if args.no_llamacpp:
            return None
        result = llamacpp_peer.llama_bench(args.model, args.threads, test, repetitions=1)
        if isinstance(result, str):
            print(f"  llama-bench {test}: {result}")
            return None
        print(f"  llama.cpp {test:<12} {result[test]:9.1f} tok/s   (load {os.getloadavg()[0]:.2f})", flush=True)
        return result[test]

    def prefill_row(n: int) -> float:
        wall, cpu = prefill_s(loaded, n, args.prefill_repeats, kv_dtypes[0])
        tok_s = n / wall
        floor = n / peaks.seconds(prefill_gemm_flops(c, n), prefill_attention_flops(c, n))
        print(f"  prefill {n:<5}         {tok_s:9.1f} tok/s   floor {floor:9.1f}  = {tok_s / floor:6.1%} "
              f"({prefill_flops(c, n) * tok_s / n / 1e9:.0f} GFLOP/s; CPU {cpu:.2f} s = "
              f"{n * args.threads / cpu:.1f} tok/s on {args.threads} busy cores)", flush=True)
        return tok_s

    def decode_row(batch: int, context: int) -> float:
        """The row for each --kv-cache-dtype; returns the first one's tok/s."""
        rates = [decode_row_kv(batch, context, kv_dtype) for kv_dtype in kv_dtypes]
        if len(rates) > 1:
            print(f"  decode b{batch:<3} ctx{context:<5} " + ", ".join(
                f"{str(d).removeprefix('torch.')} {r / rates[0]:.2f}x" for d, r in zip(kv_dtypes[1:], rates[1:]))
                + f" of {str(kv_dtypes[0]).removeprefix('torch.')} KV", flush=True)
        return rates[0]

    def decode_row_kv(batch: int, context: int, kv_dtype: torch.dtype) -> float:
        steps_phases: list = []
        step, cpu, shared = decode_step_s(loaded, batch, context, args.decode_steps, budget, kv_dtype,
                                          steps_phases if args.phases else None)
        bytes_ = weights + batch * context * kv_bytes_per_token(loaded, kv_dtype)
        byte_floor_s = bytes_ / machine.bandwidth
        # The roofline floor: the bytes a step reads at the bandwidth, or its FLOPs at the peaks
        # of the arithmetic that runs them (GEMMs at the int8 peak for quantized weights,
        # attention at the float32 rate), whichever takes longer (large batches: the FLOPs).
        gemm_flops = 2 * batch * (matmul_params(c) + c.vocab_size * c.hidden_size)
        attention_flops = 2 * 2 * batch * c.num_layers * c.q_size * context
        flop_floor_s = peaks.seconds(gemm_flops, attention_flops)
        floor_s = max(byte_floor_s, flop_floor_s)
        print(f"  decode b{batch:<3} ctx{context:<5} {batch / step:9.1f} tok/s  {step * 1e3:8.1f} ms  floor "
              f"{floor_s * 1e3:7.1f} ms = {floor_s / step:6.1%} (bytes {byte_floor_s * 1e3:.1f} ms, "
              f"{bytes_ / step / 1e9:.1f} GB/s; FLOPs {flop_floor_s * 1e3:.1f} ms at the {peaks.gemm_kind}); "
              f"CPU {cpu * 1e3:.0f} ms{'  shared ctx' if shared else ''}"
              f"{f'  KV {kv_dtype}'.replace('torch.', '') if len(kv_dtypes) > 1 else ''}", flush=True)
        if args.phases:
            phase_row(batch, context, [p for p in steps_phases if p], floor_s)
        return batch / step

    def phase_row(batch: int, context: int, rows: list[tuple[list[float], int]], floor_s: float) -> None:
        """Thread 0's median seconds per phase; each phase's floor (its FLOPs at the peaks) and
        the phase's share of the step's floor."""
        if not rows:
            print("    phases: no fused stack ran")
            return
        flops = phase_flops(c, batch, context)
        parts = []
        for i, name in enumerate(STACK_PHASES[:len(rows[0][0])]):
            t = statistics.median(r[0][i] for r in rows)
            own = peaks.seconds(*flops[name]) if name in flops else 0.0
            parts.append(f"{name} {t * 1e3:.1f}" + (f" (floor {own * 1e3:.1f} = {own / t:.0%})" if own and t else "")
                         + f" {t / floor_s:.0%}")
        total = statistics.median(sum(r[0]) for r in rows)
        print(f"    phases ms (thread 0; floor of the phase = its share; then ms / step floor): "
              + ", ".join(parts) + f"; sum {total * 1e3:.1f}; teams {[r[1] for r in rows]}", flush=True)

    for r in range(args.rounds):
        if args.quiet_load:
            wait_for_quiet(args.quiet_load, args.quiet_wait_s)
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f}):", flush=True)
        with torch.inference_mode():
            # The rows compared with llama.cpp first, each right next to its peer's number.
            pp = tg = None
            if 512 in args.prompt_lens:
                ours = prefill_row(512)
                pp = peer("pp512")
                if pp:
                    ratios.setdefault("prefill 512 / pp512", []).append(ours / pp)
            if 512 in args.contexts and 1 in args.batches:
                ours = decode_row(1, 512)
                tg = peer(f"tg{args.tg}")
                if tg:
                    ratios.setdefault(f"decode b1 ctx512 / tg{args.tg}", []).append(ours / tg)
            for n in args.prompt_lens:
                if n != 512:
                    ours = prefill_row(n)
                    if pp:
                        ratios.setdefault(f"prefill {n} / pp512", []).append(ours / pp)
            for context in args.contexts:
                for batch in args.batches:
                    if (batch, context) != (1, 512):
                        ours = decode_row(batch, context)
                        if batch == 1 and tg:
                            ratios.setdefault(f"decode b1 ctx{context} / tg{args.tg}", []).append(ours / tg)
        if ratios:
            print("  " + "; ".join(f"{k} {v[-1]:.2f}x" for k, v in ratios.items()), flush=True)
    if ratios:
        print(f"median of {args.rounds} rounds: " + "; ".join(f"{k} {statistics.median(v):.2f}x"
                                                              for k, v in ratios.items()))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
