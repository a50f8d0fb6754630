"""A cost profile fitted from a `cadence --trace` JSONL file (real steps of a real engine).

Each `{"type": "step"}` line gives the step's prefill and decode token counts and its forward
time. A trace holds no context lengths, so the attention term cannot be separated: the fit is
t = base + per_prefill_token * prefill + per_decode_token * decode, with attention's average
cost folded into the per-token terms (its coefficient is 0). It reuses the scheduler's
StepCostModel with no forgetting, i.e. a ridge regression over the whole trace.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from cadence.core.step_cost import StepCostCoefficients, StepCostModel, StepCostModelConfig
from cadence.core.step_cost import StepFeatures
from cadence.sim.cost_model import LinearCostModel
from cadence.telemetry.trace_writer import read_trace


def fit_trace(path: str | Path, min_steps: int = 8) -> LinearCostModel:
    """Fit a LinearCostModel to the step records of a trace. Raises ValueError when the file
    holds fewer than `min_steps` usable steps."""
    config = StepCostModelConfig(
        prior=dataclasses.replace(StepCostCoefficients(), per_attention_pair_s=0.0),
        forgetting=1.0,
    )
    model = StepCostModel(config)
    for record in read_trace(path):
        if record.get("type") != "step":
            continue
        try:
            prefill = int(record["num_prefill_tokens"])
            decode = int(record["num_decode_tokens"])
            seconds = float(record.get("forward_time_s") or 0.0)
            if seconds <= 0:
                seconds = float(record["t_end"]) - float(record["t_start"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: malformed step record {record!r}: {exc}") from exc
        if prefill + decode <= 0 or not math.isfinite(seconds) or seconds <= 0:
            continue
        model.observe(StepFeatures(prefill_tokens=prefill, decode_tokens=decode), seconds)
    if model.num_observations < min_steps:
        raise ValueError(
            f"{path}: {model.num_observations} usable step records, need at least {min_steps} "
            "to fit a cost profile (was it written with --trace?)"
        )
    fitted = dataclasses.replace(model.coefficients, per_attention_pair_s=0.0)
    return LinearCostModel(fitted, name=f"fitted from {Path(path).name}")
