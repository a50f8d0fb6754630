"""Drive the real cadence.core Scheduler over a workload on a virtual clock.

    plan = scheduler.schedule()
    dt   = cost_model.step_time(plan)          # instead of running a model
    out  = executor.execute(plan)              # tokens from a torch-free sampler
    clock.advance(dt); scheduler.update(plan, out); scheduler.observe_step(plan, dt)
    telemetry.record_step(...)                 # the engine's own timelines and formulas

Requests join at the first step boundary after their arrival time (an engine adds new requests
between steps too) but keep their true arrival time, so queueing shows in TTFT. The clock jumps
over idle time to the next arrival.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.contention import UNMEASURED, Contention, latest_for_machine
from cadence.core.plan import StepOutput
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.sim.clock import VirtualClock
from cadence.sim.cost_model import CostModel
from cadence.sim.sim_executor import HashSampler
from cadence.sim.step_jitter import StepJitter
from cadence.sim.workload import Workload, prompt_token_ids
from cadence.telemetry.recorder import TelemetryRecorder
from cadence.telemetry.request_timeline import RequestTimeline
from cadence.telemetry.step_trace import StepRecord



@dataclass(frozen=True)
class SimStep:
    """One simulated step. `predicted_s` is the policy's own forecast when it has one (slo)."""

    step_id: int
    t_start: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    predicted_s: float | None = None

    @classmethod
    def from_record(cls, record: StepRecord, predicted_s: float | None = None) -> SimStep:
        """The step as telemetry recorded it (simulated or real engine), plus a forecast."""
        return cls(
            step_id=record.step_id,
            t_start=record.t_start,
            duration_s=record.duration_s,
            num_prefill_tokens=record.num_prefill_tokens,
            num_decode_tokens=record.num_decode_tokens,
            num_seqs=record.num_seqs,
            predicted_s=predicted_s,
        )


@dataclass
class SimResult:
    workload: Workload
    sched: SchedulerConfig
    cache: CacheConfig
    cost_model_name: str
    timelines: dict[str, RequestTimeline]
    steps: list[SimStep] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        """First arrival to last finish (on any clock: the engine's is not zero-based)."""
        ends = [t.finished_time for t in self.timelines.values() if t.finished_time is not None]
        if not ends:
            return 0.0
        return max(ends) - min(t.arrival_time for t in self.timelines.values())

    def kind_of(self, req_id: str) -> str:
        return next(r.kind for r in self.workload.requests if r.req_id == req_id)


def default_cache(workload: Workload, block_size: int = 16) -> CacheConfig:
    """A KV cache that holds the whole workload at once (no preemption unless asked for)."""
    blocks = sum(-(-(r.prompt_tokens + r.output_tokens) // block_size) for r in workload.requests)
    return CacheConfig(block_size=block_size, num_blocks=blocks + 16)


def simulate(
    workload: Workload,
    sched: SchedulerConfig,
    cost_model: CostModel,
    cache: CacheConfig | None = None,
    executor=None,
    vocab_size: int = 49152,
    max_steps: int = 1_000_000,
    calibration: list | None = None,
    jitter: StepJitter | None = None,
    num_cores: int = 2,
    contention: Contention | float | None = None,
) -> SimResult:
    """Run `workload` to completion under `sched`; deterministic for a given input.
    With a core split (`sched.core_split` auto or disjoint; `--policy adaptive` defaults to
    auto) prompt chunks and decode steps run side by side on two teams of `num_cores`
    (simulate_split); `contention`: how much slower each team's steps run beside the other's
    than their core share alone predicts (shared memory bandwidth; core/contention.py). None:
    the latest measurement cached on this machine for `num_cores` cores (an engine's startup
    probe or `cadence sim --calibrate`), else the core share alone (UNMEASURED); a float: the
    same factor for both teams.
    `calibration`: (plan, seconds) samples of a machine profile, handed to the scheduler as
    the engine does at start (Scheduler.calibrate), so an slo policy starts from the same
    step-time model in the simulator as on the machine. `jitter`: multiplicative noise on each
    step's time (sim/step_jitter.py), a host's measured spread; None: the cost model's time."""
    cache = cache or default_cache(workload)
    scheduler = Scheduler(sched, cache)
    if calibration:
        scheduler.calibrate(calibration)
    executor = executor or HashSampler(vocab_size)
    if sched.core_split != "off" and num_cores > 1:
        from cadence.sim.split_sim import simulate_split

        if contention is None:
            contention = latest_for_machine(num_cores) or UNMEASURED
        elif not isinstance(contention, Contention):
            contention = Contention(float(contention), float(contention), num_cores,
                                    source="given")
        return simulate_split(workload, scheduler, cost_model, executor, vocab_size, max_steps,
                              jitter, num_cores, contention)
    clock = VirtualClock()
    telemetry = TelemetryRecorder(max_finished=max(1, len(workload.requests)))
    predict = getattr(scheduler.policy, "predict_step_s", None)
    pending = sorted(workload.requests, key=lambda r: (r.arrival_s, r.req_id))
    steps: list[SimStep] = []
    next_arrival = 0
    while True:
        while next_arrival < len(pending) and pending[next_arrival].arrival_s <= clock.now:
            spec = pending[next_arrival]
            params = SamplingParams(
                max_tokens=spec.output_tokens, temperature=0.0, ignore_eos=True
            )
            prompt = prompt_token_ids(spec, vocab_size, workload.seed)
            scheduler.add_request(Request(spec.req_id, prompt, params, spec.arrival_s))
            telemetry.request_arrived(spec.req_id, spec.arrival_s, spec.prompt_tokens)
            next_arrival += 1
        if not scheduler.has_unfinished():
            if next_arrival == len(pending):
                break
            clock.advance_to(pending[next_arrival].arrival_s)
            continue
        if len(steps) >= max_steps:
            raise RuntimeError(f"simulation did not finish in {max_steps} steps")
        plan = scheduler.schedule()
        if plan.is_empty:
            # Only final reports of failed requests (e.g. too big for the KV cache) are left.
            for u in scheduler.update(plan, StepOutput(plan.step_id)):
                if u.finished:
                    telemetry.finish_request(u.req_id, u.finish_reason or "error", clock.now)
            stats = scheduler.stats()
            if stats.num_running or stats.num_waiting:
                raise RuntimeError(f"scheduler made an empty step with work left: {stats}")
            continue
        predicted = predict(plan) if predict is not None else None
        duration = cost_model.step_time(plan)
        if jitter is not None:
            duration *= jitter.factor(plan)
        out = executor.execute(plan)
        t_start = clock.now
        clock.advance(duration)
        updates = scheduler.update(plan, out)
        scheduler.observe_step(plan, duration)
        telemetry.record_step(plan, out, updates, t_start, clock.now, scheduler.stats())
        steps.append(SimStep.from_record(telemetry.steps[-1], predicted))
    timelines = {t.req_id: t for t in telemetry.finished_timelines()}
    return SimResult(workload, sched, cache, cost_model.name, timelines, steps)
