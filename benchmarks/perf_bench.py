"""CPU performance of cadence next to Hugging Face transformers on the same GGUF weights.

One run prints:
  * this machine's measured memory read bandwidth and GEMM rate (torch, same run);
  * prefill tokens/s at 512 and 2048 tokens, and decode tokens/s at batch 1, 8, 32, 64 with
    every sequence at context 512 and 2048, for cadence and transformers, each with its ratio
    to the floor: decode floor = max(weight + KV bytes / bandwidth, FLOPs / GEMM rate), prefill
    floor = FLOPs / GEMM rate;
  * the engine overhead at 64 running sequences: LLMEngine with the real executor, time spent
    outside the model forward (schedule + input building + sampling + update + detokenize +
    telemetry) as a share of the whole step.

    .venv/bin/python benchmarks/perf_bench.py                       # everything (~10 min)
    .venv/bin/python benchmarks/perf_bench.py --quick               # batch 1/32, ctx 512
    .venv/bin/python benchmarks/perf_bench.py --only decode --no-hf --batches 1 --contexts 512

Medians of --repeats runs. Timings on shared cores are noisy: compare the ratios within one run.
Reports, never asserts. Importable: run_all(args) returns the rows it printed.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: a spinning pool steals the core a busy
# neighbour (or the engine's other threads) needs. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Huge pages for torch's large allocations, as cadence/__init__.py sets for the server.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from cadence.core.config import CacheConfig, SchedulerConfig  # noqa: E402
from cadence.core.plan import ScheduledChunk, StepPlan  # noqa: E402
from cadence.core.sampling_params import SamplingParams  # noqa: E402
from cadence.executor.model_runner import ModelExecutor  # noqa: E402
from cadence.model.config import ModelConfig  # noqa: E402
from cadence.model.kernels.cpu_ops import load_cpu_kernels  # noqa: E402
from cadence.model.kernels.isa import describe  # noqa: E402
from cadence.model.loader import LoadedModel, default_model_path, load_model  # noqa: E402

from _common import median_time, run_times  # noqa: E402

BLOCK_SIZE = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass(frozen=True)
class Machine:
    """Measured in this run: memory read bandwidth (bytes/s) and GEMM rates (FLOP/s)."""

    bandwidth: float
    gemm_flops: dict[torch.dtype, float]


@dataclass(frozen=True)
class Row:
    """One printed measurement."""

    what: str  # "prefill 2048", "decode b32 ctx512", ...
    system: str  # "cadence" or "transformers"
    tokens_per_s: float
    floor_tokens_per_s: float

    @property
    def ratio(self) -> float:
        return self.tokens_per_s / self.floor_tokens_per_s


# Fewest decode steps cadence's median is taken over (each is 12-250 ms).
DECODE_MIN_STEPS = 10


def measure_machine(repeats: int, dtypes=(torch.float32, torch.bfloat16)) -> Machine:
    """Read bandwidth from summing a 512 MB tensor; GEMM rate from 2048^3 matmuls per dtype
    (only the dtypes asked: bf16 matmul is a slow fallback on CPUs without native bf16).

    The best of the repeats, not the median: a floor is what the hardware can do, and
    neighbours on shared cores only ever make a run slower (this keeps ratios conservative).
    """
    big = torch.ones(128 * 1024 * 1024, dtype=torch.float32)  # 512 MB, far beyond the caches
    seconds = min(run_times(lambda: big.sum(), 2 * repeats))
    bandwidth = big.numel() * big.element_size() / seconds
    del big
    rates = {}
    n = 2048
    for dtype in dtypes:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        rates[dtype] = 2 * n ** 3 / min(run_times(lambda: a @ b, 2 * repeats))
    return Machine(bandwidth, rates)


def start_busy_neighbour() -> subprocess.Popen:
    """A process spinning one core at 100%, as another engineer's test run would."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


# ------------------------------------------------------------------------------------------
# Work and floors
def matmul_params(c: ModelConfig) -> int:
    """Weights that take part in a matmul per token, per forward (layers; not the LM head)."""
    per_layer = c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
    per_layer += 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * per_layer


def kv_bytes_per_token(c: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * c.num_layers * c.kv_size * torch.empty((), dtype=dtype).element_size()


# Bytes per weight of each storage format (int8: one float32 scale per 32 weights; int4: half a
# byte and a float16 scale and minimum per 32 weights).
WEIGHT_BYTES = {"float32": 4.0, "bf16": 2.0, "int8": 1.125, "int4": 0.625}


def weight_bytes_per_param(dtype: torch.dtype, storage: str) -> float:
    """What a decode step streams per weight: the packed format for float32 compute."""
    if dtype == torch.float32:
        return WEIGHT_BYTES[storage]
    return torch.empty((), dtype=dtype).element_size()


def weight_bytes(c: ModelConfig, dtype: torch.dtype, storage: str) -> float:
    """Bytes of weights a decode step streams: the layers in their format, the LM head in its own
    (int8 under int4 layers, fused_decode.lm_head_format)."""
    from cadence.model.fused_decode import lm_head_format

    head = c.vocab_size * c.hidden_size
    head_storage = lm_head_format(storage) if dtype == torch.float32 else storage
    return (matmul_params(c) * weight_bytes_per_param(dtype, storage)
            + head * weight_bytes_per_param(dtype, head_storage))


def decode_floor_s(c: ModelConfig, dtype: torch.dtype, batch: int, context: int,
                   m: Machine, storage: str = "float32") -> float:
    """Seconds per decode step: weights (in their stored format) + every sequence's KV read once,
    or the FLOPs at the compute dtype's GEMM rate."""
    kv_bytes = batch * context * kv_bytes_per_token(c, dtype)
    streamed = weight_bytes(c, dtype, storage)
    flops = 2 * batch * (matmul_params(c) + c.vocab_size * c.hidden_size)
    flops += 2 * 2 * batch * c.num_layers * c.q_size * context  # q.K and p.V
    return max((streamed + kv_bytes) / m.bandwidth, flops / m.gemm_flops[dtype])


def prefill_floor_s(c: ModelConfig, dtype: torch.dtype, prompt_len: int, m: Machine) -> float:
    """Seconds for one whole-prompt prefill at the GEMM rate (causal attention counted half)."""
    flops = 2 * matmul_params(c) * prompt_len
    flops += 2 * 2 * c.num_layers * c.q_size * prompt_len * prompt_len / 2
    flops += 2 * c.hidden_size * c.vocab_size  # one logits row
    return flops / m.gemm_flops[dtype]


# ------------------------------------------------------------------------------------------
# cadence
def cadence_prefill_s(loaded: LoadedModel, prompt_len: int, repeats: int) -> float:
    blocks = -(-prompt_len // BLOCK_SIZE)
    executor = ModelExecutor(loaded, num_blocks=blocks, block_size=BLOCK_SIZE, seed=0)
    ids = tuple(torch.randint(3, loaded.config.vocab_size, (prompt_len,)).tolist())
    chunk = ScheduledChunk("p", ids, 0, tuple(range(blocks)), True, GREEDY, 0)
    plan = StepPlan(0, (chunk,), BLOCK_SIZE)
    return median_time(lambda: executor.execute(plan), repeats)


def cadence_decode_s(loaded: LoadedModel, batch: int, context: int, repeats: int) -> float:
    """One decode step (forward + greedy sample) of `batch` sequences at `context`, each with
    its own scattered blocks (shuffled block ids), as a real pool ends up."""
    per_seq = context // BLOCK_SIZE + 1
    num_blocks = batch * per_seq
    executor = ModelExecutor(loaded, num_blocks=num_blocks, block_size=BLOCK_SIZE, seed=0)
    executor.kv_cache.storage.normal_(0, 1)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    chunks = tuple(
        ScheduledChunk(f"d{i}", (100 + i,), context, tuple(order[i * per_seq:(i + 1) * per_seq]),
                       True, GREEDY, 1, is_prefill=False)
        for i in range(batch)
    )
    plan = StepPlan(0, chunks, BLOCK_SIZE)
    return median_time(lambda: executor.execute(plan), repeats)


# ------------------------------------------------------------------------------------------
# transformers
def load_hf(dtype: torch.dtype):
    """transformers' model from the same GGUF (dequantized), in dtype; (model, dtype used)."""
    import transformers

    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    try:
        model = model.to(dtype)
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3]]))
        return model, dtype
    except (RuntimeError, TypeError):
        return model.to(torch.float32), torch.float32


def hf_prefill_s(model, prompt_len: int, repeats: int) -> float:
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len))

    def run():
        with torch.inference_mode():
            model(ids, logits_to_keep=1)
    return median_time(run, repeats)


def hf_decode_s(model, batch: int, context: int, repeats: int) -> float:
    """One decode step over a DynamicCache of `context` random positions per sequence (cropped
    back after each step so every repeat sees the same context)."""
    from transformers import DynamicCache

    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    dtype = next(model.parameters()).dtype
    cache = DynamicCache(config=c)
    for layer in range(c.num_hidden_layers):
        k = torch.randn(batch, c.num_key_value_heads, context, head_dim, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer)
    ids = torch.randint(3, c.vocab_size, (batch, 1))
    positions = torch.full((batch, 1), context)

    def run():
        with torch.inference_mode():
            logits = model(ids, past_key_values=cache, position_ids=positions, use_cache=True).logits
            logits[:, -1].argmax(-1)
        cache.crop(-1)  # drop the position this step appended
    return median_time(run, repeats)


# ------------------------------------------------------------------------------------------
# engine overhead
def engine_overhead(loaded: LoadedModel, num_seqs: int, prompt_len: int, steps: int) -> tuple[float, float]:
    """(median step seconds, median share outside the model forward) over `steps` decode steps
    with `num_seqs` running sequences, through LLMEngine and the real executor."""
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine

    cfg = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * prompt_len),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=num_seqs * (-(-(prompt_len + steps + 8) // BLOCK_SIZE)) + 8,
                          enable_prefix_caching=False),
    )
    engine = LLMEngine.from_loaded(loaded, cfg)
    model = engine.executor.model
    inside = [0.0]
    # The executor calls the LM head through compute_logits_and_argmax.
    forward, logits = model.forward, model.compute_logits_and_argmax

    def timed(fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            inside[0] += time.perf_counter() - start
            return out
        return run

    model.forward, model.compute_logits_and_argmax = timed(forward), timed(logits)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
        gen = torch.Generator().manual_seed(0)
        for i in range(num_seqs):
            prompt = torch.randint(3, loaded.config.vocab_size, (prompt_len,), generator=gen).tolist()
            engine.add_request(f"r{i}", prompt, params)
        def prefilling(req_id: str) -> bool:
            req = engine.scheduler.get_request(req_id)  # None once it has left the scheduler
            return req is not None and req.num_computed_tokens < prompt_len

        while engine.scheduler.stats().num_waiting or any(prefilling(f"r{i}") for i in range(num_seqs)):
            engine.step()
        engine.step()  # the first all-decode step warms up
        step_times, shares = [], []
        for _ in range(steps):
            inside[0] = 0.0
            start = time.perf_counter()
            engine.step()
            total = time.perf_counter() - start
            step_times.append(total)
            shares.append((total - inside[0]) / total)
        return statistics.median(step_times), statistics.median(shares)
    finally:
        model.forward, model.compute_logits_and_argmax = forward, logits


# ------------------------------------------------------------------------------------------
def run_all(args: argparse.Namespace) -> list[Row]:
    """Run the selected benchmarks and print them; returns the throughput rows."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    neighbour = start_busy_neighbour() if args.busy_neighbour else None
    try:
        return _run_all(args)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()


def _run_all(args: argparse.Namespace) -> list[Row]:
    kernels = load_cpu_kernels()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY')}, CPU kernels {'on' if kernels else 'OFF'}, "
          f"block_size {BLOCK_SIZE}{', with a busy neighbour process' if args.busy_neighbour else ''}")
    from cadence.model.kernels.isa import native_bf16

    machine = measure_machine(args.repeats, (torch.float32, torch.bfloat16) if native_bf16() or args.dtype == "bfloat16"
                              else (torch.float32,))
    print(f"measured: memory read {machine.bandwidth / 1e9:.1f} GB/s, GEMM "
          + ", ".join(f"{str(d).replace('torch.', '')} {r / 1e9:.0f} GFLOP/s" for d, r in machine.gemm_flops.items()))
    start = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype, device="cpu", quantization=args.quantization)
    dtype = loaded.dtype
    storage = loaded.model.decode_weight_format
    print(f"cadence: {loaded.name} {dtype} compute, {storage if dtype == torch.float32 else dtype} weights, "
          f"{describe()}, loaded in {time.perf_counter() - start:.1f} s")
    hf = hf_dtype = None
    if not args.no_hf and args.only in (None, "prefill", "decode"):
        hf, hf_dtype = load_hf(dtype)
        print(f"transformers: same GGUF, {hf_dtype}")
    c = loaded.config
    rows: list[Row] = []

    def report(what: str, system: str, seconds: float, tokens: int, floor_s: float,
               note: str = "") -> None:
        row = Row(what, system, tokens / seconds, tokens / floor_s)
        rows.append(row)
        print(f"  {what:<22} {system:<12} {row.tokens_per_s:9.1f} tok/s  {seconds * 1e3:9.1f} ms"
              f"   floor {row.floor_tokens_per_s:8.1f} tok/s  = {row.ratio:6.1%} of floor{note}")

    with torch.inference_mode():
        if args.only in (None, "prefill"):
            print("prefill (one prompt, logits of the last row):")
            for n in args.prompt_lens:
                floor_s = prefill_floor_s(c, dtype, n, machine)
                report(f"prefill {n}", "cadence", cadence_prefill_s(loaded, n, args.repeats), n, floor_s)
                if hf is not None:
                    report(f"prefill {n}", "transformers", hf_prefill_s(hf, n, args.repeats), n,
                           prefill_floor_s(c, hf_dtype, n, machine))
        if args.only in (None, "decode"):
            print("decode (one step, forward + greedy sample; tok/s = batch / step time):")
            for context in args.contexts:
                for batch in args.batches:
                    what = f"decode b{batch} ctx{context}"
                    floor_s = decode_floor_s(c, dtype, batch, context, machine, storage)
                    # At least DECODE_MIN_STEPS steps: a 45 ms step times 3 repeats is short
                    # enough for one slow phase of the shared host to move the median.
                    step_s = cadence_decode_s(loaded, batch, context, max(args.repeats, DECODE_MIN_STEPS))
                    # The team of the last step: 1 means the stack had gone solo (a neighbour
                    # held a core, or looked like it), which halves a batch's speed.
                    team = loaded.model.decode_stack_team()
                    report(what, "cadence", step_s, batch, floor_s,
                           f"   (team {team})" if team is not None else "")
                    if hf is not None:
                        report(what, "transformers", hf_decode_s(hf, batch, context, args.repeats),
                               batch, decode_floor_s(c, hf_dtype, batch, context, machine))
    if args.only in (None, "overhead"):
        step_s, share = engine_overhead(loaded, args.overhead_seqs, args.overhead_prompt,
                                        args.overhead_steps)
        print(f"engine overhead at {args.overhead_seqs} running sequences (prompt "
              f"{args.overhead_prompt}): step {step_s * 1e3:.1f} ms, outside the forward "
              f"{share:.1%} of the step")
    if not args.no_llamacpp and args.only in (None, "prefill", "decode"):
        rows += llamacpp_rows(c, machine, args.threads, report)
    if hf is not None:
        print("cadence / transformers:")
        by_key = {(r.what, r.system): r for r in rows}
        for (what, system), row in by_key.items():
            other = by_key.get((what, "transformers"))
            if system == "cadence" and other is not None:
                print(f"  {what:<22} {row.tokens_per_s / other.tokens_per_s:6.2f}x")
    # A list, not a dict by test name: the Q4_1 and F16 rows share their names (pp512, tg128).
    peer = [r for r in rows if r.system.startswith("llama.cpp")]
    if peer:
        print("cadence / llama.cpp's best (same GGUF, same threads):")
        best_tg = max((r.tokens_per_s for r in peer if "tg128" in r.what), default=None)
        best_pp = max((r.tokens_per_s for r in peer if "pp512" in r.what), default=None)
        for row in rows:
            if row.system != "cadence":
                continue
            if best_tg and row.what.startswith("decode b1 "):
                print(f"  {row.what:<22} {row.tokens_per_s / best_tg:6.2f}x llama.cpp tg128 ({best_tg:.1f} tok/s)")
            if best_pp and row.what.startswith("prefill"):
                print(f"  {row.what:<22} {row.tokens_per_s / best_pp:6.2f}x llama.cpp pp512 ({best_pp:.1f} tok/s)")
    return rows


# Bytes per weight of llama.cpp's GGUF formats (Q4_1: 32 weights in 2 fp16 + 16 bytes).
GGUF_BYTES = {"Q4_1": 20 / 32, "F16": 2.0}


def llamacpp_rows(c: ModelConfig, machine: Machine, threads: int, report) -> list[Row]:
    """llama-bench pp512 / tg128 on the shipped Q4_1 GGUF and an F16 copy, each against the floor
    of its own weight format (skipped with a message where llama.cpp is not built)."""
    import llamacpp_peer

    from cadence.model.loader import default_model_path

    q = default_model_path()
    print("llama.cpp (llama-bench, same threads):")
    for fmt, path in (("Q4_1", q), ("F16", llamacpp_peer.f16_file(q))):
        if path is None:
            print(f"  {fmt}: skipped (llama-quantize not built)")
            continue
        result = llamacpp_peer.llama_bench(path, threads)
        if isinstance(result, str):
            print(f"  {fmt}: skipped: {result}")
            return []
        weights = (matmul_params(c) + c.vocab_size * c.hidden_size) * GGUF_BYTES[fmt]
        for test, tok_s in result.items():
            n = int(test[2:])
            if test.startswith("pp"):
                floor_s = prefill_floor_s(c, torch.float32, n, machine)
                report(f"{test}", f"llama.cpp {fmt}", n / tok_s, n, floor_s)
            else:
                flops = 2 * (matmul_params(c) + c.vocab_size * c.hidden_size)
                floor_s = max(weights / machine.bandwidth, flops / machine.gemm_flops[torch.float32])
                report(f"{test}", f"llama.cpp {fmt}", 1 / tok_s, 1, floor_s)
    return []


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="compute dtype (auto: bf16 where the CPU has it natively, else float32)")
    parser.add_argument("--quantization", default="auto", choices=("auto", "none", "bf16", "int8", "int4"),
                        help="weight storage of the float32 fast path (auto: int8 with --dtype auto)")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("prefill", "decode", "overhead"), default=None,
                        help="run one part only")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument("--no-llamacpp", action="store_true",
                        help="skip llama.cpp (benchmarks/llamacpp_peer.py --build builds it once)")
    parser.add_argument("--overhead-seqs", type=int, default=64)
    parser.add_argument("--overhead-prompt", type=int, default=128)
    parser.add_argument("--overhead-steps", type=int, default=10)
    parser.add_argument("--busy-neighbour", action="store_true",
                        help="run a process spinning one core throughout (thread-setting check)")
    parser.add_argument("--quick", action="store_true",
                        help="batch 1 and 32 at context 512, prefill 2048, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.contexts, args.prompt_lens, args.repeats = [1, 32], [512], [2048], 3
    return args


if __name__ == "__main__":
    run_all(parse_args())
