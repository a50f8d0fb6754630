"""How often decode steps run between a prompt chunk's layers, and how large the chunk is
(--core-split interleave, --policy adaptive's default).

Under interleave the prompt chunk runs on every core and the decode stream's steps run between
two of its layers. Two numbers decide what that costs:
- the pace, the time from one decode step's start to the next: the streams' gap while a prompt
  prefills is about one pace, and the prompt's prefill is slowed by the decode steps' time per
  pace. The pace is set from the measured decode step time so that the decode steps take
  a share s of the prefill's time: pace = step x (1 + 1 / s), so a document's TTFT grows by
  about (1 + s) while the streams get a token as often as it allows. The share is
      s = min(BOUND_SHARE x (max_prefill_slowdown - 1), max(DECODE_SHARE, s_target)),
  s_target = step / (PACE_CAP x target - step), the share whose pace is PACE_CAP x the ITL
  target. So the target shortens the pace (a share above DECODE_SHARE) only while the prompt
  slowdown bound the slo policy keeps (--max-prefill-slowdown, 1.15) holds; where even the
  bound's share leaves the pace past the target (a slow step: 27 ms for the 1B shape's three
  rows, 2 cores, against 100 ms) the target is out of reach, the pace is the gap the streams
  get, and it is reported as the reachable target (cadence:itl_target_reachable_seconds), as
  slo reports its own. The bound wins over the target because a missed target is a longer gap
  for a few streams for the document's prefill, a missed bound the document's TTFT and every
  prompt queued behind it; capped at 0.8 x the target (80 ms), the 1B pace had a share of
  0.3-0.5 and its document TTFT 1.22-1.33x eager's (issue 30's bound 1.15x). BOUND_SHARE
  (0.8) leaves a margin, as PACE_CAP does for the target: the steps slow the prefill by more
  than their own time (a step between two layers runs slower than alone, evicts the
  prefill's cached activations, and steps start at the pause point nearest the pace, up to
  half a piece early): on the 1B doc-burst a share of 0.15 measured TTFT 1.08-1.17x eager's,
  0.12 1.05-1.08x (largest gap 0.30-0.36 s, eager's ~11 s), and with this rule at the
  default flags 0.99-1.05x, gaps 0.34-0.45 s (0.03-0.04x eager's; docs/performance.md "Should
  `adaptive` be the default?"). At the default flags the bound's
  0.12 is below DECODE_SHARE, so 0.12 sets the pace (9.3 steps); DECODE_SHARE is the share
  for a larger --max-prefill-slowdown (>= 1.19) while the target is met.
  A step runs at the pause point nearest to a pace after the last one's start, so steps
  start a pace apart on average and at most half a piece more (at the last boundary before
  the pace was up, they started 35-80 ms apart for a 75 ms pace: more steps than the share).
  (Measured on the 2-core Zen 4 host, SmolLM2-135M: a 3-row decode step at context 300 takes
  5.5-7.5 ms alone and 6-8.5 ms between two prompt layers, 0.4 ms of it schedule and outputs,
  and a warm rerun of the same plan is about as slow, so the caches cost little (earlier,
  at context ~50-100 on older code: 6.1 ms alone, 9-11.5 ms paused): at 0.1 a pace of 70-100
  ms, so the cap (80 ms at the default target) mostly sets it there. At 0.15 (70-80 ms) a
  Poisson mix at 2 req/s (AVX2) served 0.84-0.87x disagg's goodput in one run; at 0.1
  1.22-2.1x the former fixed pace's in one call, within this host's run-to-run spread. At 0.2
  (a 55-69 ms pace) the document's TTFT was already 1.34-1.44x eager's in-process, over issue
  34's 1.3x bound, with 300-512-token chunks. With the pauses between row blocks below (the
  document in one chunk), doc-burst over HTTP in two calls (docs/performance.md): at 0.15
  TTFT 1.01-1.24x eager's, stall 0.058-0.084 s (disagg 0.037-0.042 s; 0.1 on main: 0.090-0.099
  s); at 0.2 and 0.25 1.20-1.85x, stalls 0.038-0.115 s: hence 0.15. In-process, where the
  largest gap is the pace plus about half a block plus the steps' jitter, 0.15 gave 46-60 ms
  and 0.25 40-47 ms; over HTTP, with the blocks sized inside the forward, 0.15 and 0.2
  measured 0.093-0.185 s on the best tier (the code before: 0.060-0.183 s) and 0.060-0.091 s
  on AVX2 (0.062-0.109 s) in one call each: no share steadier than another, 0.15 stays; the bound's 0.12
  now caps it at the default flags.)
- the chunk and its pause points: the pauses are at layer boundaries (between two layers and
  between a layer's attention and its MLP) and, where the model computes each row the same
  whatever rows share its ops (packed integer or GGUF GEMMs, every row's attention through the
  paged kernel: the default model; LlamaDecoderLayer._splits_rows), between row blocks of those
  ops (model/pause_points.py): a block's attention rows need only the keys of earlier rows,
  which earlier blocks wrote, so the blocks run in order and give the bits of the whole op
  (invariant 1). A pause between blocks costs a time compare when no step is due. The blocks
  of each op group (a layer's attention, its MLP) are the size whose slowest block, at the
  previous group of that kind's slowest seconds per row, takes SEGMENT_SHARE of the pace
  (model/pause_points.py: a layer's attention rows slow down along the chunk, so the rate is
  measured inside the forward, not carried from an earlier chunk), ROW_BLOCK before a
  measurement, at least MIN_ROW_BLOCK; a step then waits at most about half a block past the
  pace for its turn, not a layer segment, so the chunk is no longer bounded by
  the pace: once the model has shown it splits rows, chunks are the token budget (a
  1650-token document in one step, eager's per-token cost; blocks of 128-512 rows cost
  nothing measurable against the whole ops: 0.89-0.97x, SmolLM2 Q4_1, 2 cores, one
  `cpu_excl` call). Elsewhere (float weights through torch's GEMM, the flash prefill
  kernel) the ops run whole and the chunk is the largest whose segment fits SEGMENT_SHARE of
  the pace (from the measured segment time per chunk token; steps then start at most 1.125
  paces apart), within the step's token budget. Larger chunks cost less per token (the GEMMs
  run in longer tiles, fewer steps' fixed work): a 1650-token document took 1.10x as long in
  512-token chunks as in one step there, 0.97-1.0x in 1024-token ones; the longest segment
  measured 48-68 us per chunk token (SmolLM2, 2 cores), so a 75 ms pace keeps the first
  chunk's 512 tokens there.
"""

from __future__ import annotations

import math
import os

# Decode seconds per second of prefill while a prompt's chunk is paused for decode steps
# (CADENCE_DECODE_SHARE sets it for A/B runs).
DECODE_SHARE = float(os.environ.get("CADENCE_DECODE_SHARE", "0.15"))
# The longest pace the ITL target asks for, as a share of the target (a margin for the
# step's own variation).
PACE_CAP = 0.8
# The most decode share the prompt slowdown bound allows, as a share of the bound's
# (max_prefill_slowdown - 1): a margin for what the steps cost the prefill beyond their own time.
BOUND_SHARE = 0.8
# The longest piece of a chunk between two pause points (a layer segment, or a row block of
# one), as a share of the pace.
SEGMENT_SHARE = 0.25
# Rows per block of a layer's ops before the blocks are measured, and the fewest (smaller
# blocks run the GEMMs in short tiles and pay the pause check and the ops' fixed work more often).
ROW_BLOCK = 256
MIN_ROW_BLOCK = 64


def interleave_pace_s(decode_step_s: float | None, target_itl_s: float,
                      max_prefill_slowdown: float) -> float:
    """Seconds from one paused decode step's start to the next, given the measured decode
    step time (None: not measured yet, PACE_CAP x the target): the decode steps' share of the
    prefill is DECODE_SHARE, more where the ITL target needs it, never more than the prompt
    slowdown bound allows (the module's docstring)."""
    cap = PACE_CAP * target_itl_s
    if decode_step_s is None or decode_step_s <= 0:
        return cap
    most = BOUND_SHARE * (max_prefill_slowdown - 1.0)
    # The target's share: the pace is the cap (none is enough where one step passes the cap).
    needed = decode_step_s / (cap - decode_step_s) if cap > decode_step_s else math.inf
    share = min(most, max(DECODE_SHARE, needed))
    return decode_step_s * (1.0 + 1.0 / share)


def interleave_chunk_tokens(segment_s_per_token: float | None, pace_s: float, first: int,
                            budget: int, rows_split: bool = False) -> int:
    """Prompt tokens of the next interleaved chunk: the largest whose longest layer segment
    (measured seconds per chunk token) fits SEGMENT_SHARE of the pace, at least `first` (the
    chunk before any measurement, --split-prefill-chunk) and at most the token budget; the
    budget where the model pauses between row blocks (rows_split: the segment bounds nothing)."""
    if rows_split:
        return budget
    if segment_s_per_token is None or segment_s_per_token <= 0:
        return min(first, budget)
    fits = int(SEGMENT_SHARE * pace_s / segment_s_per_token)
    return max(min(first, budget), min(budget, fits))


def interleave_row_block(block_s_per_row: float | None, pace_s: float, budget: int) -> int:
    """Rows per block of a chunk's layer ops: the most whose longest block (measured seconds
    per row) fits SEGMENT_SHARE of the pace, at least MIN_ROW_BLOCK, ROW_BLOCK before any
    measurement, at most the token budget."""
    if block_s_per_row is None or block_s_per_row <= 0:
        return min(ROW_BLOCK, budget)
    return max(MIN_ROW_BLOCK, min(budget, int(SEGMENT_SHARE * pace_s / block_s_per_row)))
