"""SplitStepper: prefill and decode side by side in one engine, on split cores (--core-split).

Each call of `step()` is one turn of the engine loop:
    1. the prefill team's plan, if it finished, is taken by the scheduler (update): a request
       whose prompt is done now decodes; it moves from one stream to the other by that state
       change alone, its KV stays in its blocks (one pool, one set of weights);
    2. when the prefill team is free, CoreSplit decides the next interval's split from the
       measured load; no split means a colocated step of the --policy on every core (today's
       behaviour, and always so with one core); a split starts the prefill stream's next plan
       (Scheduler.schedule_prefill: prompt chunks only) on the prefill team's thread;
    3. the decode stream's plan (Scheduler.schedule_decodes: the requests whose prompt is done,
       none of the prefill stream's) runs on this thread with the decode team's thread count;
       with nothing to decode, the turn waits a little for the prefill team instead (the loop
       still polls its socket between turns, so arrivals are admitted during a long chunk).
Every scheduler call, block allocation and prefix-cache update stays on this thread; the
prefill team only computes (its KV writes go to blocks no other request holds). A request
aborted while its chunk computes keeps its blocks until the chunk ends (Scheduler._finish).
Tokens are those of a colocated run: both teams compute a row the same way, and neither the
split nor its changes decide which rows share a step's kernels beyond what batching already
may (invariant 1).
"""

from __future__ import annotations

import math
import os
import sys
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from cadence.core.core_split import CoreSplit, SplitDecision
from cadence.core import interleave_pace
from cadence.core.interleave_pace import interleave_chunk_tokens, interleave_pace_s, interleave_row_block
from cadence.core.plan import StepOutput, StepPlan
from cadence.executor.thread_team import ThreadTeam, set_thread_count, torch_threads
from cadence.model.pause_points import PausePoints


class SplitStepper:
    # Longest wait for the prefill team in a turn with nothing to decode (the loop polls its
    # socket between turns).
    WAIT_S = 0.02
    # Overlapping teams: a decode step starts every PACE x the ITL target (a margin for the
    # wake-up and the step's own variation).
    PACE = 0.8
    # The interpreter's GIL switch interval while split (sys.setswitchinterval).
    GIL_SWITCH_S = 0.0005

    def __init__(self, engine: Any, num_cores: int, pin: bool | None = None,
                 prior_contention: float | None = None) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler
        cfg = self.scheduler.sched
        # prior_contention: the machine's measured decode contention (core/contention.py).
        self.split = CoreSplit(num_cores, cfg.target_itl_ms / 1000.0,
                               allow_overlap=cfg.core_split in ("auto", "interleave"),
                               prior_contention=prior_contention)
        self.chunk_tokens = cfg.split_prefill_chunk
        # The prompt slowdown bound the pace keeps (core/interleave_pace.py).
        self._max_prefill_slowdown = cfg.max_prefill_slowdown
        # The latest interleaved chunk's pace where it was past the ITL target (the bound's
        # pace: the gap the streams get), reported as the reachable target; None while reachable.
        self._reachable_pace_s: float | None = None
        # 'interleave': no second team; the prefill stream's chunk runs on every core and the
        # decode stream's steps run between two of its layers, a step every PACE x the target
        # (time-sliced at layer boundaries instead of cores shared by two teams: on a host
        # whose cores also serve the front end and clients, an extra busy thread beside a
        # parallel region stalls the region at each preemption). Needs a pausable executor.
        self.interleave = (cfg.core_split == "interleave"
                           and getattr(engine.executor, "can_pause", False))
        self._last_decode_t = 0.0
        # Interleave's measurements (core/interleave_pace.py): the seconds the chunk is paused
        # for one decode step (schedule, forward, outputs sent), the chunk's longest layer
        # segment per chunk token and its longest row block per row (running averages), and
        # whether the model pauses between row blocks (then the segment bounds no chunk).
        self._paused_decode_s: float | None = None
        self._segment_s_per_token: float | None = None
        self._block_s_per_row: float | None = None
        self._rows_split = False
        self._budget = cfg.max_num_batched_tokens
        if pin is None:  # CADENCE_PIN_TEAMS=1 pins the prefill team to its cores
            # Off by default: on a host shared with other processes a pinned team cannot move
            # off a busy core; the thread counts alone keep the teams within the cores.
            pin = os.environ.get("CADENCE_PIN_TEAMS", "0") == "1"
        # The teams take turns at the GIL between their kernels: hand it over within 0.5 ms
        # (not the default 5) so neither waits on the other's Python. close() restores it.
        self._switch_interval_before = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval_before, self.GIL_SWITCH_S))
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._cores = allowed if pin and len(allowed) >= num_cores else None
        self._team: ThreadTeam | None = None
        # The prefill team's plan in flight: (plan, future, engine-clock start, perf start).
        self._inflight: tuple[StepPlan, Future, float, float] | None = None
        self._decode_threads = num_cores
        # The loop thread's own thread count, restored by close() (the decode team's count is
        # set on this thread).
        self._threads_before = torch_threads()
        self._overlap = False  # the current split shares cores (decode steps paced)
        self.num_overlapped_decode_steps = 0
        self._wall_since = time.perf_counter()
        # Listeners of split changes (the trace writer): f(decision, t).
        self.on_change: list[Any] = []

    # -- the turn -------------------------------------------------------------------------
    def step(self) -> list[Any]:
        engine, sched = self.engine, self.scheduler
        engine.last_executed = (None, 0.0)  # this step's executor call, where it makes one
        outputs, engine._pending = engine._pending, []
        outputs += self._collect(0.0)
        if self._inflight is None:
            decision = self._decide()
            if decision.is_split:
                plan = sched.schedule_prefill(self._interleave_chunk() if self.interleave
                                              else self.chunk_tokens)
                if plan is not None:
                    if self.interleave:
                        return outputs + self._interleaved(plan)
                    self._launch(plan, decision)
            if self._inflight is None:
                return outputs + self._colocated()
        set_thread_count(self._decode_threads)
        plan = sched.schedule_decodes()
        if plan.is_empty and not _moves_blocks(plan):
            outputs += engine._finish_step(plan, StepOutput(step_id=plan.step_id), engine._clock())
            return outputs + self._collect(self.WAIT_S)
        t_start = engine._clock()
        t0 = time.perf_counter()
        try:
            out = engine.executor.execute(plan)
        except Exception as exc:  # fails the decode stream's requests, not the engine
            return outputs + engine._fail_plan(plan, exc)
        overlapped = self._inflight is not None and self._overlap
        engine.last_executed = (plan, time.perf_counter() - t0)
        self.split.observe_decode(self._decode_threads, plan.num_decode_tokens,
                                  engine.last_executed[1], contended=self._inflight is not None,
                                  overlapped=overlapped)
        outputs += engine._finish_step(plan, out, t_start)
        if overlapped:
            self.num_overlapped_decode_steps += 1
            # On the prefill team's cores: the next decode step waits for the target's
            # rhythm (or the prefill's end), leaving the cores to the prefill meanwhile.
            rest = t0 + self.PACE * self.split.target_itl_s - time.perf_counter()
            if rest > 0:
                outputs += self._collect(rest)
        return outputs

    def pace_s(self) -> float:
        """Interleave: seconds from one paused decode step's start to the next."""
        return interleave_pace_s(self._paused_decode_s, self.split.target_itl_s,
                                 self._max_prefill_slowdown)

    def _interleave_chunk(self) -> int:
        return interleave_chunk_tokens(self._segment_s_per_token, self.pace_s(),
                                       self.chunk_tokens, self._budget, self._rows_split)

    def _interleaved(self, plan: StepPlan) -> list[Any]:
        """The prefill stream's `plan` on every core of this thread; between two of its layers
        the decode stream's next step whenever one is due (this boundary is the nearest to a
        pace after the last one's start: core/interleave_pace.py), and short prompts
        that arrived meanwhile (interjected whole), their tokens sent at once (the engine
        loop's emit hook). Where the model runs a layer's ops over row blocks, a due decode
        step also runs between two blocks (model/pause_points.py)."""
        engine, sched, split = self.engine, self.scheduler, self.split
        cores = split.num_cores
        set_thread_count(cores)
        self._decode_threads = cores
        pace = self.pace_s()
        self._reachable_pace_s = pace if pace > split.target_itl_s else None
        emitted: list[Any] = []
        # The chunk's own segments: when the latest one started (the hook's return) and the
        # longest one so far, interjections and decode steps left out.
        segment = {"start": time.perf_counter(), "longest": 0.0, "paused": 0.0}

        def due_at() -> float:
            """When a row blocks' pause is due: a pace after the last decode step's start."""
            return self._last_decode_t + pace if sched.num_decode_rows() else math.inf

        def between_layers() -> None:
            t0 = time.perf_counter()
            segment["longest"] = max(segment["longest"], t0 - segment["start"])
            try:
                paused(t0, points.piece_s)
            finally:
                segment["start"] = time.perf_counter()
                segment["paused"] += segment["start"] - t0
                points.due_at = due_at()

        def paused(t0: float, piece: float) -> None:
            if engine._poll_arrivals is not None:
                engine._poll_arrivals()
            # A short prompt that arrived during the chunk runs here whole (the colocated
            # interjection), not after the chunk: its first token goes out at once.
            if sched.may_interject(plan) and sched.interjection_wanted(plan):
                engine._interject(plan)
                t0 = time.perf_counter()
            # Due at the pause point nearest to the pace's end (the next one is about a piece
            # away: a layer segment, or a row block): steps start a pace apart on average, so
            # they take the share of the prefill's time the pace was set for.
            if t0 + piece / 2 - self._last_decode_t < pace or not sched.num_decode_rows():
                return
            dplan = sched.schedule_decodes()
            self._last_decode_t = t0
            if dplan.is_empty and not _moves_blocks(dplan):
                # Rows but nothing to step (none seen in doc-burst runs): the next try is a
                # pace away, not at every row block's pause from here on.
                engine._finish_step(dplan, StepOutput(step_id=dplan.step_id), engine._clock())
                return
            t_start = engine._clock()
            try:
                out = engine.executor.execute(dplan)
            except Exception as exc:  # fails the decode stream's requests, not the chunk
                outs = engine._fail_plan(dplan, exc)
            else:
                split.observe_decode(cores, dplan.num_decode_tokens, time.perf_counter() - t0,
                                     contended=False)
                self.num_overlapped_decode_steps += 1
                outs = engine._finish_step(dplan, out, t_start)
            if engine._emit is not None:
                engine._emit(outs)
            else:
                emitted.extend(outs)
            self._paused_decode_s = _ema(self._paused_decode_s, time.perf_counter() - t0)

        points = PausePoints(between_layers, interleave_row_block(self._block_s_per_row, pace, self._budget),
                             block_s=interleave_pace.SEGMENT_SHARE * pace,
                             min_rows=interleave_pace.MIN_ROW_BLOCK)
        points.due_at = due_at()

        t_start = engine._clock()
        t0 = time.perf_counter()
        try:
            out = engine.executor.execute(plan, between_layers=points)
        except Exception as exc:  # fails the prefill stream's requests, not the engine
            sched.drop_prefill(plan)
            return emitted + engine._fail_plan(plan, exc)
        split.observe_prefill(time.perf_counter() - t0)
        # The chunk's own executor time (benchmarks read it), its pauses left out.
        engine.last_executed = (plan, max(0.0, time.perf_counter() - t0 - segment["paused"]))
        self._rows_split = self._rows_split or points.split_rows
        if points.s_per_row:  # the next chunk's first blocks (later ones adapt in the forward)
            self._block_s_per_row = _ema(self._block_s_per_row, max(points.s_per_row.values()))
        if segment["longest"] > 0 and plan.num_prefill_tokens >= self.chunk_tokens:
            # Full-size chunks only: a short one's fixed work per segment would count per token.
            self._segment_s_per_token = _ema(self._segment_s_per_token,
                                             segment["longest"] / plan.num_prefill_tokens)
        return emitted + engine._finish_step(plan, out, t_start)

    def _colocated(self) -> list[Any]:
        engine = self.engine
        cores = self.split.num_cores
        set_thread_count(cores)
        self._decode_threads = cores
        outputs = engine._step_colocated()
        plan, seconds = engine.last_executed
        if plan is not None and plan.num_prefill_tokens == 0:
            self.split.observe_decode(cores, plan.num_decode_tokens, seconds, contended=False)
            if self._paused_decode_s is None:  # interleave's first pace, until it measures
                self._paused_decode_s = seconds
        return outputs

    def _decide(self) -> SplitDecision:
        sched = self.scheduler
        before = self.split.current
        decision = self.split.decide(sched.num_decode_rows(), sched.num_prompt_tokens_waiting())
        if decision != before:
            now = self.engine._clock()
            for listener in self.on_change:
                listener(decision, now)
        return decision

    def _launch(self, plan: StepPlan, decision: SplitDecision) -> None:
        cores = None
        self._overlap = decision.overlaps(self.split.num_cores)
        if self._cores is not None:
            first = 0 if self._overlap else decision.decode_threads
            cores = self._cores[first:first + decision.prefill_threads]
        if self._team is None:
            self._team = ThreadTeam("prefill", decision.prefill_threads, cores)
        else:
            self._team.resize(decision.prefill_threads, cores)
        self._decode_threads = decision.decode_threads
        execute = self.engine.executor.execute
        future = self._team.submit(lambda: execute(plan))
        self._inflight = (plan, future, self.engine._clock(), time.perf_counter())

    def _collect(self, timeout: float) -> list[Any]:
        """The prefill team's finished plan, taken by the scheduler (waits up to `timeout`)."""
        if self._inflight is None:
            return []
        plan, future, t_start, t0 = self._inflight
        if not future.done():
            if timeout <= 0 or not wait_futures([future], timeout=timeout).done:
                return []
        self._inflight = None
        self.split.observe_prefill(time.perf_counter() - t0)
        engine = self.engine
        try:
            out = future.result()
        except Exception as exc:  # fails the prefill stream's requests, not the engine
            self.scheduler.drop_prefill(plan)
            return engine._fail_plan(plan, exc)
        return engine._finish_step(plan, out, t_start)

    # -- introspection --------------------------------------------------------------------
    @property
    def prefill_in_flight(self) -> bool:
        return self._inflight is not None

    # Seconds over which each team's utilisation is measured (stats() reports the latest
    # whole window: it is read every loop turn and from the heartbeat thread).
    UTILISATION_WINDOW_S = 2.0

    def stats(self) -> dict[str, Any]:
        """The current split, each team's utilisation (busy / wall over the latest window),
        split changes so far and the measured decode contention."""
        now = time.perf_counter()
        wall = now - self._wall_since
        if wall >= self.UTILISATION_WINDOW_S:
            busy = self.split.take_busy()
            self._utilisation = {team: min(1.0, busy[team] / wall) for team in busy}
            self._wall_since = now
        current = self.split.current
        utilisation = getattr(self, "_utilisation", {"decode": 0.0, "prefill": 0.0})
        reachable = {}
        if self._reachable_pace_s is not None:  # the interleave pace's gap, or slo's if longer
            colocated = getattr(self.scheduler.policy, "reachable_itl_s", None) or 0.0
            reachable = {"itl_target_reachable_s": max(colocated, self._reachable_pace_s)}
        return {
            **reachable,
            "split_decode_threads": current.decode_threads,
            "split_prefill_threads": current.prefill_threads,
            "decode_team_utilisation": utilisation["decode"],
            "prefill_team_utilisation": utilisation["prefill"],
            "num_core_split_changes_total": self.split.num_changes,
            "decode_contention": self.split.contention,
        }

    def drain(self) -> list[Any]:
        """Wait for the prefill team's plan in flight and take it (before a colocated call
        such as abort-all or close)."""
        outputs = []
        while self._inflight is not None:
            outputs += self._collect(1.0)
        return outputs

    def close(self) -> None:
        self.drain()
        if self._team is not None:
            self._team.close()
            self._team = None
        set_thread_count(self._threads_before)
        sys.setswitchinterval(self._switch_interval_before)


def _ema(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def _moves_blocks(plan: StepPlan) -> bool:
    return bool(plan.block_copies or plan.swap_out or plan.swap_in or plan.disk_out
                or plan.disk_in or plan.disk_discard)
