"""When does swapping a preempted request's KV beat recomputing it? Measured on this machine.

A preempted request resumes either by recompute (its computed tokens are prefilled again) or
by swap (its full KV blocks are copied out when it is preempted and back when it resumes):
to host memory (`--num-swap-blocks`) or to the disk tier (`--kv-offload-dir`). For each
context length L this script times, on the real model and the engine's own executor:

- recompute: a prefill of L tokens from position 0 (what resuming by recompute adds);
- host swap: copying L/block_size blocks device -> host pool, then back (executor.swap_blocks);
- disk swap: writing them to the disk tier's block files and reading them back
  (executor.move_blocks), warm (the files still in the page cache, what a resume soon after
  the preemption sees) and cold (fsync'd, then dropped from the page cache with
  posix_fadvise(DONTNEED) before the read: the device's own speed);

and prints what the scheduler's cost choice (`Scheduler._choose_tier`, fed with the engine's
startup measurements and step-time model) picks, plus the disk speed per block at which
recompute would win (break-even). Medians of `--repeats` runs. Run un-niced, on a quiet host:

    .venv/bin/python benchmarks/kv_offload_cost.py [--lengths 16,64,256,1024,2048]
        [--dtype auto] [--offload-dir /tmp] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from rich.console import Console

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


def prefill_plan(length: int, block_size: int, step_id: int) -> StepPlan:
    chunk = ScheduledChunk(
        req_id="bench", token_ids=tuple(100 + (i % 50) for i in range(length)), start_pos=0,
        block_table=tuple(range(-(-length // block_size))), sample=True, sampling=_GREEDY,
        output_index=0, is_prefill=True, num_prompt_tokens=length)
    return StepPlan(step_id=step_id, chunks=(chunk,), block_size=block_size)


def median(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def drop_page_cache(store, slots) -> None:
    for slot in slots:
        fd = os.open(store.path(slot), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(engine: LLMEngine, length: int, repeats: int) -> dict:
    ex = engine.executor
    bs = ex.block_size
    n = length // bs  # only full blocks are swapped; a partial last block is recomputed
    recompute_s = median(lambda: ex.execute(prefill_plan(length, bs, 0)), repeats)
    pairs = tuple((i, i) for i in range(n))
    out = StepPlan(step_id=-1, chunks=(), block_size=bs, swap_out=pairs)
    back = StepPlan(step_id=-1, chunks=(), block_size=bs, swap_in=pairs)
    host_s = median(lambda: (ex.swap_blocks(out), ex.swap_blocks(back)), repeats)
    disk_out = StepPlan(step_id=-1, chunks=(), block_size=bs, disk_out=pairs)
    disk_in = StepPlan(step_id=-1, chunks=(), block_size=bs, disk_in=pairs)

    def disk_round(cold: bool) -> float:
        t0 = time.perf_counter()
        io = ex.move_blocks(disk_out)
        t1 = time.perf_counter()
        if cold:
            drop_page_cache(ex.disk, range(n))
        t2 = time.perf_counter()
        io2 = ex.move_blocks(disk_in)
        t3 = time.perf_counter()
        if io.failed_slots or io2.failed_slots:
            raise RuntimeError(f"disk I/O failed: {io.error or io2.error}")
        return (t1 - t0) + (t3 - t2)

    disk_round(False)
    warm = statistics.median(disk_round(False) for _ in range(repeats))
    cold = statistics.median(disk_round(True) for _ in range(repeats))
    for slot in range(n):
        ex.disk.discard(slot)
    sched = engine.scheduler
    req = Request("bench", list(range(length)), SamplingParams(max_tokens=1), 0.0)
    req.num_computed_tokens = n * bs
    free_host = sched.swap.num_free_blocks
    choice = sched._choose_tier(req, n) if n else None
    sched.swap._free, saved = [], sched.swap._free  # host tier full: disk or recompute
    choice_no_host = sched._choose_tier(req, n) if n else None
    sched.swap._free = saved
    assert sched.swap.num_free_blocks == free_host
    return {
        "tokens": length, "blocks": n, "recompute_s": recompute_s, "host_swap_s": host_s,
        "disk_swap_warm_s": warm, "disk_swap_cold_s": cold,
        "predicted_recompute_s": sched._recompute_s(n * bs),
        "choice": choice or "recompute", "choice_host_full": choice_no_host or "recompute",
        # Disk I/O per block (write + read) above which recompute would be cheaper.
        "break_even_disk_ms_per_block": 1e3 * recompute_s / n if n else None,
    }


def e2e_stall(loaded, length: int, mode: str, root: str) -> dict:
    """End to end through the engine: a low-priority request with `length` prompt tokens is
    decoding when an urgent one arrives and the pool has no room for it, so the low one is
    preempted (priority scheduling) and resumes after the urgent one finished. Returns the
    low request's stall (urgent added -> its next token) and how it was preempted."""
    blocks = -(-(length + 8) // 16) + 1  # the low request fits; the urgent one does not
    cache = CacheConfig(block_size=16, num_blocks=blocks,
                        num_swap_blocks=blocks if mode == "host" else 0,
                        kv_offload_dir=root if mode == "disk" else None,
                        kv_offload_disk_blocks=blocks, enable_prefix_caching=False)
    cfg = EngineConfig(scheduler=SchedulerConfig(policy="chunked", scheduling="priority",
                                                 max_num_batched_tokens=max(2048, length + 64),
                                                 max_model_len=max(4096, length + 64)),
                       cache=cache, startup_profile=False)
    engine = LLMEngine.from_loaded(loaded, cfg)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("low", [100 + (i % 50) for i in range(length)], params, priority=1)
    got = 0
    while got < 2:
        got += sum(len(o.new_token_ids) for o in engine.step() if o.req_id == "low")
    t0 = time.perf_counter()
    engine.add_request("urgent", [60 + (i % 30) for i in range(32)],
                       SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), priority=0)
    while not any(o.req_id == "low" and o.new_token_ids for o in engine.step()):
        pass
    stall = time.perf_counter() - t0
    stats = engine.scheduler.stats()
    while engine.has_unfinished():
        engine.step()
    engine.close()
    how = ("disk swap" if stats.num_disk_swap_preemptions_total else
           "host swap" if stats.num_swap_preemptions_total else
           "recompute" if stats.num_preemptions_total else "not preempted")
    return {"tokens": length, "mode": mode, "stall_s": stall, "preempted_by": how}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--lengths", default="16,32,64,128,256,512,1024,2048")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--offload-dir", default=None, help="disk tier root (default: a temp dir)")
    p.add_argument("--json", default=None)
    p.add_argument("--e2e-lengths", default="256,2048",
                   help="context lengths of the end-to-end check ('' to skip)")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    root = args.offload_dir or tempfile.mkdtemp(prefix="kv-offload-bench-")
    max_len = max(lengths)
    blocks = -(-max_len // 16) + 8
    cfg = EngineConfig(
        model=args.model, dtype=args.dtype,
        scheduler=SchedulerConfig(max_num_batched_tokens=max(2048, max_len),
                                  max_model_len=max(4096, max_len + 16)),
        cache=CacheConfig(block_size=16, num_blocks=blocks, num_swap_blocks=blocks,
                          kv_offload_dir=root, kv_offload_disk_blocks=blocks),
    )
    console = Console()
    engine = LLMEngine(cfg)
    sched = engine.scheduler
    console.print(f"model {engine.model_name}, {engine.summary().get('dtype')}, block 16 "
                  f"tokens; startup measurements: host copy {sched.swap_block_copy_s*1e3:.3f} "
                  f"ms/block one way, disk write {sched.disk_block_write_s*1e3:.3f} / read "
                  f"{sched.disk_block_read_s*1e3:.3f} ms/block; disk tier in {root}")
    rows = [measure(engine, n, args.repeats) for n in lengths]
    engine.close()
    e2e = []
    for n in [int(x) for x in args.e2e_lengths.split(",") if x]:
        for mode in ("recompute", "host", "disk"):
            runs = [e2e_stall(engine.executor.loaded, n, mode, root) for _ in range(args.repeats)]
            e2e.append({**runs[0], "stall_s": statistics.median(r["stall_s"] for r in runs)})
    cols = ("tokens", "blocks", "recompute ms", "host swap ms", "disk warm ms", "disk cold ms",
            "recompute/host", "recompute/disk cold", "predicted recompute ms", "choice",
            "choice (host full)", "break-even disk ms/block")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        def ms(x):
            return f"{x * 1e3:.1f}"
        full = bool(r["blocks"])
        cells = [r["tokens"], r["blocks"], ms(r["recompute_s"]), ms(r["host_swap_s"]),
                 ms(r["disk_swap_warm_s"]), ms(r["disk_swap_cold_s"]),
                 f"{r['recompute_s'] / r['host_swap_s']:.0f}x" if full else "-",
                 f"{r['recompute_s'] / r['disk_swap_cold_s']:.0f}x" if full else "-",
                 ms(r["predicted_recompute_s"]), r["choice"], r["choice_host_full"],
                 f"{r['break_even_disk_ms_per_block']:.1f}" if full else "-"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    cross_host = [r["tokens"] for r in rows if r["blocks"] and r["host_swap_s"] >= r["recompute_s"]]
    cross_disk = [r["tokens"] for r in rows
                  if r["blocks"] and r["disk_swap_cold_s"] >= r["recompute_s"]]
    console.print("crossover: recompute beats host swap at "
                  + (f"{cross_host} tokens" if cross_host else "no measured length")
                  + "; beats cold disk swap at "
                  + (f"{cross_disk} tokens" if cross_disk else "no measured length")
                  + " (contexts under one block, 16 tokens, always recompute).")
    if e2e:
        print()
        print("End to end (priority preemption by an urgent 32-token request; the low request's "
              "stall from the urgent arrival to its next token, median):")
        print("| tokens | resume by | preempted by | stall ms |")
        print("|---|---|---|---|")
        for r in e2e:
            print(f"| {r['tokens']} | {r['mode']} | {r['preempted_by']} | "
                  f"{r['stall_s'] * 1e3:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": engine.model_name, "rows": rows, "e2e": e2e}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
