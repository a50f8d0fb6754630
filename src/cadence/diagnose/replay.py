"""Replay a recorded workload in the simulator under other settings and pick the one that
best meets the SLO.

The workload is the recording's requests (arrival offsets, prompt and output lengths). The
step cost comes from the recording itself: a linear fit of the engine's step periods when it
has steps (t = base + a * prompt tokens + b * decode tokens, the scheduler's own StepCostModel
with no forgetting), or, from client times only, the solo ITL as the step base and the long
prompts' TTFT per token as the prefill cost (coarse; the report says which). The recorded
setting is simulated too: its error against what was measured is the error the prediction
states.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cadence.bench.config import SLOConfig
from cadence.core.config import STEP_TIME_POLICIES, SchedulerConfig
from cadence.core.step_cost import StepCostCoefficients, StepCostModel, StepCostModelConfig
from cadence.core.step_cost import StepFeatures
from cadence.diagnose.recording import Recording, RequestRec
from cadence.sim.cost_model import LinearCostModel
from cadence.sim.metrics import percentile
from cadence.sim.simulator import simulate
from cadence.sim.workload import SimRequestSpec, Workload

CHUNKED_BUDGETS = (64, 128, 256, 512, 1024, 2048)
METRICS = ("ttft_p50_s", "ttft_p99_s", "long_ttft_s", "itl_p50_s", "itl_p99_s", "max_gap_s",
           "slo_attainment")


@dataclass(frozen=True)
class Setting:
    policy: str
    max_num_batched_tokens: int
    target_itl_ms: float | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        text = f"{self.policy} budget {self.max_num_batched_tokens}"
        if self.policy in STEP_TIME_POLICIES and self.target_itl_ms:
            text += f" target {self.target_itl_ms:.0f} ms"
        return text + "".join(f" {k}={v}" for k, v in self.extra)

    @property
    def serve_flags(self) -> str:
        flags = f"--policy {self.policy} --max-num-batched-tokens {self.max_num_batched_tokens}"
        if self.policy in STEP_TIME_POLICIES and self.target_itl_ms:
            flags += f" --target-itl-ms {self.target_itl_ms:g}"
        return flags + "".join(f" --{k.replace('_', '-')} {v}" for k, v in self.extra)


@dataclass
class Outcome:
    """Metrics of one setting (simulated, or measured for the recording itself)."""

    setting: Setting | None
    metrics: dict[str, float | None]
    meets_slo: bool = False
    score: float = math.inf  # worst p-metric / limit over the SLOs (<= 1 meets)


@dataclass
class Recommendation:
    slo: dict[str, float]
    slo_assumed: bool
    cost_model: str
    measured: Outcome
    baseline: Outcome | None  # the recorded setting, simulated
    sim_error: dict[str, float]  # relative error of the baseline per metric
    candidates: list[Outcome] = field(default_factory=list)
    best: Outcome | None = None
    num_cores: int = 1
    # Why --policy adaptive is advised (decode stalls from prefill on a machine of more than
    # one core, and the recorded setting does not split cores), None when it is not.
    split_advice: str | None = None

    @property
    def stated_error(self) -> float | None:
        keys = [k for k in ("ttft_p99_s", "itl_p99_s", "max_gap_s") if k in self.sim_error]
        return max((self.sim_error[k] for k in keys), default=None)


def metrics_of(requests: list[RequestRec] | list[Any], slo: dict[str, float],
               long_prompt: int) -> tuple[dict[str, float | None], float]:
    """Metric dict and the fraction of requests meeting the SLO (bench's rule: TTFT <= ttft and
    the request's largest gap <= itl)."""
    ttft, gaps, long_ttft, met = [], [], [], 0
    for r in requests:
        t = r.ttft
        g = r.gaps
        if t is not None:
            ttft.append(t)
            if r.prompt_tokens >= long_prompt:
                long_ttft.append(t)
        gaps.extend(g)
        ok = t is not None
        if "ttft" in slo and (t is None or t > slo["ttft"]):
            ok = False
        if "itl" in slo and g and max(g) > slo["itl"]:
            ok = False
        met += ok
    m = {"ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
         "long_ttft_s": max(long_ttft) if long_ttft else None,
         "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
         "max_gap_s": max(gaps) if gaps else None,
         "slo_attainment": met / len(requests) if requests else 0.0}
    return m, m["slo_attainment"]


def _score(m: dict[str, float | None], slo: dict[str, float]) -> float:
    parts = []
    if "ttft" in slo and m["ttft_p99_s"] is not None:
        parts.append(m["ttft_p99_s"] / slo["ttft"])
    if "itl" in slo and m["max_gap_s"] is not None:
        parts.append(m["max_gap_s"] / slo["itl"])
    return max(parts) if parts else 0.0


def workload_of(rec: Recording) -> Workload:
    t0 = rec.t0
    specs = tuple(SimRequestSpec(r.req_id, max(0.0, r.arrival - t0), max(1, r.prompt_tokens),
                                 max(1, r.output_tokens)) for r in rec.requests)
    return Workload(rec.name, tuple(sorted(specs, key=lambda s: (s.arrival_s, s.req_id))))


def fit_cost_model(rec: Recording, solo_itl_s: float | None) -> LinearCostModel:
    if rec.steps:
        model = StepCostModel(StepCostModelConfig(
            prior=dataclasses.replace(StepCostCoefficients(), per_attention_pair_s=0.0),
            forgetting=1.0))
        prev_end = None
        for s in sorted(rec.steps, key=lambda s: s["t_end"]):
            start, end = float(s["t_start"]), float(s["t_end"])
            # The step's period when the engine was busy (loop overhead between steps is part
            # of what a stream waits), else its own duration.
            if prev_end is not None and 0 <= start - prev_end < 0.05:
                start = prev_end
            prev_end = end
            p, d = int(s["num_prefill_tokens"]), int(s["num_decode_tokens"])
            if p + d > 0 and end > start:
                model.observe(StepFeatures(prefill_tokens=p, decode_tokens=d), end - start)
        if model.num_observations >= 4:
            c = dataclasses.replace(model.coefficients, per_attention_pair_s=0.0)
            return LinearCostModel(c, name=f"fitted to {model.num_observations} recorded steps")
    # Client times only.
    base = solo_itl_s or 0.05
    per_token = []
    for r in rec.requests:
        if r.ttft is not None and r.prompt_tokens >= 128:
            per_token.append(max(0.0, r.ttft - base) / r.prompt_tokens)
    per_prefill = percentile(per_token, 50) if per_token else 0.001
    coeffs = dataclasses.replace(StepCostCoefficients(), base_s=base, per_prefill_token_s=per_prefill,
                                 per_decode_token_s=0.0, per_attention_pair_s=0.0)
    return LinearCostModel(coeffs, name="estimated from client times (solo ITL as the step, "
                                        "long prompts' TTFT per token as the prefill cost)")


def candidate_settings(recorded: Setting | None, slo: dict[str, float],
                       num_cores: int = 1) -> list[Setting]:
    budget = recorded.max_num_batched_tokens if recorded else 512
    out = [Setting("eager", budget)]
    out += [Setting("chunked", b) for b in CHUNKED_BUDGETS]
    itl = slo.get("itl")
    if itl:
        out += [Setting("slo", max(budget, 512), round(itl * 1000 * f)) for f in (0.5, 0.8)]
    if num_cores > 1:
        # Prefill beside decode on split cores (simulated on num_cores with this machine's
        # measured contention); at the ITL target when the SLO states one.
        out.append(Setting("adaptive", max(budget, 2048),
                           round(itl * 1000 * 0.8) if itl else None))
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    if "max_num_partial_prefills" in fields:
        out += [Setting("chunked", 256, extra=(("max_num_partial_prefills", n),)) for n in (2, 4)]
    if recorded is not None and recorded not in out:
        out.insert(0, recorded)
    return out


def recorded_setting(settings: dict[str, Any]) -> Setting | None:
    policy = settings.get("policy")
    budget = settings.get("max_num_batched_tokens")
    if not policy or not budget:
        return None
    return Setting(policy, int(budget), settings.get("target_itl_ms") if policy in STEP_TIME_POLICIES else None)


def simulate_setting(setting: Setting, workload: Workload, cost: LinearCostModel,
                     slo: dict[str, float], long_prompt: int, num_cores: int = 1) -> Outcome:
    max_len = max(r.prompt_tokens + r.output_tokens for r in workload.requests) + 16
    kwargs: dict[str, Any] = dict(policy=setting.policy,
                                  max_num_batched_tokens=setting.max_num_batched_tokens,
                                  max_num_seqs=max(64, len(workload.requests)),
                                  max_model_len=max(8192, max_len))
    if setting.target_itl_ms:
        kwargs["target_itl_ms"] = setting.target_itl_ms
    kwargs.update(dict(setting.extra))
    result = simulate(workload, SchedulerConfig(**kwargs), cost, num_cores=num_cores)
    reqs = []
    for spec in workload.requests:
        t = result.timelines.get(spec.req_id)
        if t is None:
            continue
        reqs.append(RequestRec(spec.req_id, spec.prompt_tokens, t.arrival_time, t.first_token_time,
                               list(t.token_times), t.num_output_tokens, t.first_scheduled_time))
    m, _ = metrics_of(reqs, slo, long_prompt)
    score = _score(m, slo)
    return Outcome(setting, m, meets_slo=m["slo_attainment"] >= 0.99 and score <= 1.0, score=score)


def recommend(rec: Recording, slo_text: str | None, target_itl_s: float,
              solo_itl_s: float | None, recorded: Setting | None = None,
              num_cores: int | None = None, prefill_stalls: int = 0) -> Recommendation:
    """Simulate the candidate settings over the recorded workload and pick the best.
    `num_cores`: the engine's cores (default: the recording's, else 1); with more than one,
    --policy adaptive is a candidate, and `prefill_stalls` (decode stalls the diagnosis
    blamed on prefill) make it the advice when the recorded setting does not split cores."""
    slo = SLOConfig.parse(slo_text).limits() if slo_text else {}
    assumed = not slo
    if assumed:
        slo = {"itl": target_itl_s}
    long_prompt = max(256, int(0.5 * max(r.prompt_tokens for r in rec.requests)))
    recorded = recorded or recorded_setting(rec.settings)
    cost = fit_cost_model(rec, solo_itl_s)
    workload = workload_of(rec)
    m, _ = metrics_of(rec.requests, slo, long_prompt)
    measured = Outcome(recorded, m, meets_slo=m["slo_attainment"] >= 0.99 and _score(m, slo) <= 1,
                       score=_score(m, slo))
    cores = num_cores or rec.num_cores or 1
    out = Recommendation(slo, assumed, cost.name, measured, None, {}, num_cores=cores)
    for setting in candidate_settings(recorded, slo, cores):
        outcome = simulate_setting(setting, workload, cost, slo, long_prompt, cores)
        out.candidates.append(outcome)
        if setting == recorded:
            out.baseline = outcome
    if out.baseline is not None:
        for k in METRICS:
            sim, real = out.baseline.metrics.get(k), measured.metrics.get(k)
            if sim is not None and real:
                out.sim_error[k] = abs(sim - real) / abs(real)
    out.best = min(out.candidates, key=lambda o: (
        -o.metrics["slo_attainment"], o.score, o.metrics["ttft_p99_s"] or 0.0))
    splits = rec.settings.get("core_split") not in (None, "off") or (
        recorded is not None and recorded.policy == "adaptive")
    if cores > 1 and prefill_stalls and not splits:
        adaptive = next(o for o in out.candidates if o.setting.policy == "adaptive")
        out.split_advice = (
            f"{prefill_stalls} decode stalls came from prefill in the same steps, on a machine "
            f"of {cores} cores: --policy adaptive runs prompt chunks beside the decode steps on "
            f"split cores (simulated: largest gap {_seconds(adaptive.metrics['max_gap_s'])}, "
            f"{100 * adaptive.metrics['slo_attainment']:.0f}% within the SLO; recorded: "
            f"{_seconds(measured.metrics['max_gap_s'])}, "
            f"{100 * measured.metrics['slo_attainment']:.0f}%).")
    return out


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"
