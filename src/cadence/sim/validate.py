"""Does the simulator predict the machine? Run the same workloads on the real engine and in the
simulator (calibrated from a profile of this machine) and print each metric's error.

This is the one module of cadence.sim that touches the model stack (the real engine, imported
lazily inside `profile_machine` and `run_real`); the rest of the package stays torch-free.

Both sides use the same formulas: the real run's telemetry (engine clock, token time = end of
the step that produced it) goes through `cadence.sim.metrics.summarize` like a simulated run.
The real run adds requests at their arrival times on the wall clock, between steps, as an
engine does; the simulator jumps its virtual clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.sim.calibration import Samples
from cadence.sim.cost_model import CostModel
from cadence.sim.metrics import SimSummary, percentile, summarize
from cadence.sim.simulator import SimResult, SimStep, default_cache, simulate
from cadence.sim.workload import DOCUMENT, STREAM, SimRequestSpec, Workload, doc_burst
from cadence.sim.workload import prompt_token_ids


@dataclass(frozen=True)
class Case:
    """One validation workload under one scheduler config."""

    name: str
    workload: Workload
    sched: SchedulerConfig


def default_cases(scale: float = 1.0) -> list[Case]:
    """Six mixes of streams, document lengths and policies, sized to run in well under a
    minute each on a 2-core CPU (`scale` multiplies the token counts)."""

    def n(tokens: int) -> int:
        return max(1, round(tokens * scale))

    # Streams long enough to be still decoding when the document arrives (0.5 s) on a
    # machine 3x faster than the Zen 3 host: with 24 tokens they had finished by then on Zen 4,
    # and on a machine in between, a few ms of noise decided whether the document's chunks
    # were gaps in the streams (p99 ITL 318 ms real vs 12 ms simulated).
    def burst(streams: int, doc: int, out: int = 80) -> Workload:
        return doc_burst(num_streams=streams, stream_prompt_tokens=n(48),
                         stream_output_tokens=n(out), doc_prompt_tokens=n(doc),
                         doc_output_tokens=4, doc_arrival_s=0.5, stream_arrival_window_s=0.0)

    chats = Workload("chats", tuple(
        [SimRequestSpec(f"stream-{i}", 0.3 * i, n(40 + 8 * i), n(48)) for i in range(4)]
        + [SimRequestSpec("doc", 0.4, n(512), 4, DOCUMENT)]
    ))
    return [
        Case("2 streams + 512 doc, eager", burst(2, 512),
             SchedulerConfig(policy="eager", max_num_batched_tokens=2048)),
        Case("2 streams + 512 doc, chunked 128", burst(2, 512),
             SchedulerConfig(policy="chunked", max_num_batched_tokens=128)),
        Case("3 streams + 1024 doc, slo default", burst(3, 1024), SchedulerConfig()),
        Case("4 streams + 768 doc, chunked 256", burst(4, 768),
             SchedulerConfig(policy="chunked", max_num_batched_tokens=256)),
        Case("8 streams + 512 doc, slo 300 ms", burst(8, 512, out=64),
             SchedulerConfig(target_itl_ms=300.0)),
        Case("staggered chats + 512 doc, slo default", chats, SchedulerConfig()),
    ]


def profile_machine(loaded, block_size: int = 16, repeats: int = 3) -> Samples:
    """Time the synthetic profile steps on this machine's executor."""
    from cadence.core.step_profile import profile_steps
    from cadence.executor.model_runner import ModelExecutor

    executor = ModelExecutor(loaded, num_blocks=256, block_size=block_size)
    return profile_steps(executor.execute, block_size, 256, loaded.config.max_position_embeddings,
                         repeats=repeats)


def run_real(loaded, case: Case, samples: Samples) -> SimResult:
    """The case on the real engine, requests added at their arrival times (wall clock)."""
    from cadence.engine.config import EngineConfig
    from cadence.engine.llm_engine import LLMEngine

    cache = default_cache(case.workload)
    engine = LLMEngine.from_loaded(
        loaded, EngineConfig(scheduler=case.sched, cache=cache, startup_profile=False)
    )
    engine.scheduler.calibrate(samples)  # what the engine's own startup profile would do
    vocab = loaded.config.vocab_size
    pending = sorted(case.workload.requests, key=lambda r: (r.arrival_s, r.req_id))
    t0 = time.monotonic()
    i = 0
    while i < len(pending) or engine.has_unfinished():
        now = time.monotonic()
        while i < len(pending) and t0 + pending[i].arrival_s <= now:
            spec = pending[i]
            params = SamplingParams(max_tokens=spec.output_tokens, temperature=0.0,
                                    ignore_eos=True)
            engine.add_request(spec.req_id, prompt_token_ids(spec, vocab, case.workload.seed),
                               params, arrival_time=t0 + spec.arrival_s)
            i += 1
        if engine.has_unfinished():
            engine.step()
        elif i < len(pending):
            time.sleep(max(0.0, t0 + pending[i].arrival_s - time.monotonic()))
    rec = engine.telemetry
    timelines = {t.req_id: t for t in rec.finished_timelines()}
    steps = [SimStep.from_record(r) for r in rec.steps]
    return SimResult(case.workload, case.sched, cache, "real engine", timelines, steps)


def run_sim(case: Case, cost_model: CostModel, samples: Samples, vocab_size: int) -> SimResult:
    return simulate(case.workload, case.sched, cost_model, default_cache(case.workload),
                    vocab_size=vocab_size, calibration=samples)


# (label, how to read it from a result and its summary); the first two are the acceptance's.
def _ttft_mean(result: SimResult, s: SimSummary) -> float | None:
    values = [t.ttft for t in result.timelines.values() if t.ttft is not None]
    return sum(values) / len(values) if values else None


def _itl_p99_all(result: SimResult, s: SimSummary) -> float | None:
    gaps = [g for t in result.timelines.values() for g in t.itl]
    return percentile(gaps, 99)


METRICS = (
    ("p99 ITL (all requests)", _itl_p99_all),
    ("mean TTFT", _ttft_mean),
    ("doc TTFT", lambda r, s: s.doc_ttft_s),
    ("stream max gap in doc prefill", lambda r, s: s.stream_max_gap_during_doc_s),
    ("stream p50 ITL", lambda r, s: s.stream_itl_p50_s),
    ("makespan", lambda r, s: s.makespan_s),
)
ACCEPTANCE = ("p99 ITL (all requests)", "mean TTFT")


@dataclass(frozen=True)
class Row:
    case: str
    metric: str
    real_s: float | None
    sim_s: float | None

    @property
    def error(self) -> float | None:
        """(sim - real) / real."""
        if self.real_s is None or self.sim_s is None or self.real_s <= 0:
            return None
        return (self.sim_s - self.real_s) / self.real_s


def compare(case: Case, real: SimResult, sim: SimResult) -> list[Row]:
    rs, ss = summarize(real), summarize(sim)
    return [Row(case.name, label, get(real, rs), get(sim, ss)) for label, get in METRICS]


__all__ = ["ACCEPTANCE", "Case", "Row", "STREAM", "compare", "default_cases", "profile_machine",
           "run_real", "run_sim"]
