"""The simulator's --core-split auto: prompt chunks and decode steps side by side on two teams.

The same loop as the engine's SplitStepper, on the virtual clock: whenever the prefill team is
free the real CoreSplit decides the split from the simulated load; a split starts the
scheduler's prefill-stream plan (Scheduler.schedule_prefill), which ends `duration` later,
while the decode stream's plans (Scheduler.schedule_decodes) step one after another beside it;
no split runs the policy's colocated step on every core. A step on `t` of the `cores` threads
takes the cost model's time (a step on every core) times cores / t (the work of a step does
not shrink with fewer cores), times the team's measured contention factor while the other team
computes beside it (the memory bandwidth both share; core/contention.py). Requests join at step
boundaries, as in simulate(). 'interleave' (--policy adaptive's default) has one team: a
chunk on every core, lengthened by the decode steps (on every core, no contention) that run
between its layers, a step each pace (core/interleave_pace.py, from the predicted decode step).
"""

from __future__ import annotations

from cadence.core.contention import Contention
from cadence.core.core_split import CoreSplit
from cadence.core.interleave_pace import interleave_pace_s
from cadence.core.plan import StepOutput, StepPlan
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.sim.clock import VirtualClock
from cadence.sim.cost_model import CostModel
from cadence.sim.step_jitter import StepJitter
from cadence.sim.workload import Workload, prompt_token_ids
from cadence.telemetry.recorder import TelemetryRecorder


# The engine's pacing of overlapped decode steps (engine/split_stepper.py SplitStepper.PACE;
# not imported: the simulator does not load the engine's torch side).
PACE = 0.8


def simulate_split(workload: Workload, scheduler: Scheduler, cost_model: CostModel, executor,
                   vocab_size: int, max_steps: int, jitter: StepJitter | None, num_cores: int,
                   contention: Contention):
    from cadence.sim.simulator import SimResult, SimStep

    sched = scheduler.sched
    clock = VirtualClock()
    telemetry = TelemetryRecorder(max_finished=max(1, len(workload.requests)))
    split = CoreSplit(num_cores, sched.target_itl_ms / 1000.0,
                      allow_overlap=sched.core_split in ("auto", "interleave"),
                      prior_contention=contention.decode)
    pace_s = PACE * split.target_itl_s
    # --core-split interleave (adaptive's default): one team; the decode steps run on every
    # core between the chunk's layers, the chunk lengthened by their time.
    interleave = sched.core_split == "interleave"
    overlap = False
    pending = sorted(workload.requests, key=lambda r: (r.arrival_s, r.req_id))
    steps: list[SimStep] = []
    next_arrival = 0
    # The prefill team's plan: (plan, its output, start, end), and the decode team's threads.
    inflight: tuple[StepPlan, StepOutput, float, float] | None = None
    decode_threads = num_cores

    def duration(plan: StepPlan, threads: int, beside: bool) -> float:
        seconds = cost_model.step_time(plan) * num_cores / threads
        if beside:
            seconds *= contention.prefill if plan.num_prefill_tokens else contention.decode
        if jitter is not None:
            seconds *= jitter.factor(plan)
        return seconds

    def record(plan: StepPlan, out: StepOutput, t_start: float, t_end: float) -> None:
        updates = scheduler.update(plan, out)
        telemetry.record_step(plan, out, updates, t_start, t_end, scheduler.stats())
        steps.append(SimStep.from_record(telemetry.steps[-1]))

    def finish_reported(plan: StepPlan) -> None:
        for u in scheduler.update(plan, StepOutput(plan.step_id)):
            if u.finished:
                telemetry.finish_request(u.req_id, u.finish_reason or "error", clock.now)

    while True:
        while next_arrival < len(pending) and pending[next_arrival].arrival_s <= clock.now:
            spec = pending[next_arrival]
            params = SamplingParams(max_tokens=spec.output_tokens, temperature=0.0,
                                    ignore_eos=True)
            prompt = prompt_token_ids(spec, vocab_size, workload.seed)
            scheduler.add_request(Request(spec.req_id, prompt, params, spec.arrival_s))
            telemetry.request_arrived(spec.req_id, spec.arrival_s, spec.prompt_tokens)
            next_arrival += 1
        if inflight is not None and inflight[3] <= clock.now:
            record(*inflight)
            inflight = None
        if inflight is None and not scheduler.has_unfinished():
            if next_arrival == len(pending):
                break
            clock.advance_to(pending[next_arrival].arrival_s)
            continue
        if len(steps) >= max_steps:
            raise RuntimeError(f"simulation did not finish in {max_steps} steps")
        if inflight is None:
            decision = split.decide(scheduler.num_decode_rows(),
                                    scheduler.num_prompt_tokens_waiting())
            if decision.is_split:
                plan = scheduler.schedule_prefill(sched.split_prefill_chunk)
                if plan is not None:
                    rows = scheduler.num_decode_rows()
                    seconds = duration(plan, decision.prefill_threads, rows > 0)
                    overlap = decision.overlaps(num_cores)
                    if interleave:
                        seconds = duration(plan, num_cores, False)
                        if rows:  # the decode steps' share of each pace (the engine's rule)
                            # from the step alone on every core, as the engine measures it
                            # paused (nothing computes beside it: no contention).
                            step_s = split.predict_alone_decode_s(rows) or 0.0
                            pace_s = interleave_pace_s(step_s or None, split.target_itl_s,
                                                       sched.max_prefill_slowdown)
                            seconds /= 1.0 - min(0.9, step_s / pace_s)
                    elif overlap and rows:
                        pace_s = PACE * split.target_itl_s
                        # The paced decode thread takes one core for its steps' share of time.
                        step_s = split.predict_decode_s(1, rows) or 0.0
                        seconds /= 1.0 - min(0.9, step_s / pace_s) / num_cores
                    inflight = (plan, executor.execute(plan), clock.now, clock.now + seconds)
                    decode_threads = num_cores if interleave else decision.decode_threads
            if inflight is None:  # a colocated step on every core
                plan = scheduler.schedule()
                if plan.is_empty:
                    finish_reported(plan)
                    continue
                seconds = duration(plan, num_cores, False)
                out = executor.execute(plan)
                t_start = clock.now
                clock.advance(seconds)
                record(plan, out, t_start, clock.now)
                scheduler.observe_step(plan, seconds)
                if plan.num_prefill_tokens == 0:
                    split.observe_decode(num_cores, plan.num_decode_tokens, seconds, False)
                continue
        plan = scheduler.schedule_decodes()
        if plan.is_empty:
            finish_reported(plan)
            wake = inflight[3]
            if next_arrival < len(pending):
                wake = min(wake, pending[next_arrival].arrival_s)
            clock.advance_to(max(clock.now, wake))
            continue
        seconds = duration(plan, decode_threads, not interleave)
        out = executor.execute(plan)
        t_start = clock.now
        clock.advance(seconds)
        record(plan, out, t_start, clock.now)
        split.observe_decode(decode_threads, plan.num_decode_tokens, seconds, not interleave,
                             overlapped=overlap and not interleave)
        if overlap:  # paced: the next decode step starts a pace after this one
            clock.advance_to(max(clock.now, min(t_start + pace_s, inflight[3])))
    timelines = {t.req_id: t for t in telemetry.finished_timelines()}
    name = (f"{cost_model.name}; split contention decode x{contention.decode:.2f} prefill "
            f"x{contention.prefill:.2f} ({contention.source})")
    return SimResult(workload, sched, scheduler.cache, name, timelines, steps)
