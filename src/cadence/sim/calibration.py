"""A step-cost model calibrated from a short profile of the machine (instead of a hardware
table): the same synthetic steps the engine times at start (core/step_profile.py), fitted by
non-negative relative least squares (core/step_cost.fit_coefficients) into a LinearCostModel.

A profile is saved as JSON (`cadence sim calibrate --out FILE`) so later simulations need no
model and no torch:

    {"machine": "...", "samples": [{"decodes": 4, "decode_ctx": 64, "chunk": 128,
                                    "chunk_start": 0, "seconds": 0.41}, ...]}
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from cadence.core.plan import StepPlan
from cadence.core.step_cost import StepFeatures, fit_coefficients, prompt_token_curve
from cadence.core.step_profile import ProfileShape, build_plan, shape_of
from cadence.sim.cost_model import LinearCostModel

Samples = list[tuple[StepPlan, float]]


def cost_model_from_samples(samples: Samples, name: str = "calibrated") -> LinearCostModel:
    """A LinearCostModel fitted to (plan, seconds) samples: steps the fused stack takes
    (decode-only, short chunks) and steps on the per-op path fitted apart when the profile has
    enough of both (LinearCostModel.decode_only). ValueError without samples."""
    features = [(StepFeatures.of_plan(p), s) for p, s in samples]
    per_op = [(f, s) for f, s in features if f.prompt_step]
    stack = [(f, s) for f, s in features if not f.prompt_step]
    if len(per_op) >= 3 and len(stack) >= 2:
        model = LinearCostModel(fit_coefficients(per_op), name=name,
                                decode_only=fit_coefficients(stack))
    else:
        model = LinearCostModel(fit_coefficients(features), name=name)
    # Prompt chunks of >= CURVE_MIN_TOKENS cost per token what the profile measured at their
    # size (the engine's slo floor reads the same curve): chunks of 128-256 tokens cost 10-20%
    # more per token than a document's 1000-token chunk on the Zen 3 host.
    model.prompt_token_curve = prompt_token_curve(features, model.prompt_step_time)
    return model


def save_profile(path: str | Path, samples: Samples, machine: str = "") -> None:
    rows = [{**asdict(shape_of(p)), "seconds": s} for p, s in samples]
    Path(path).write_text(json.dumps({"machine": machine, "samples": rows}, indent=2))


def load_profile(path: str | Path, block_size: int = 16) -> Samples:
    """The (plan, seconds) samples of a saved profile. ValueError on a malformed file."""
    try:
        data = json.loads(Path(path).read_text())
        rows = data["samples"]
        samples = []
        for row in rows:
            seconds = float(row.pop("seconds"))
            plan = build_plan(ProfileShape(**row), block_size, num_blocks=1 << 30)
            if plan is not None and seconds > 0:
                samples.append((plan, seconds))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a cadence step profile: {exc}") from exc
    if not samples:
        raise ValueError(f"{path}: the profile holds no usable samples")
    return samples
