"""A step-cost model calibrated from a short profile of the machine (instead of a hardware
table): the same synthetic steps the engine times at start (core/step_profile.py), fitted by
non-negative relative least squares (core/step_cost.fit_coefficients) into a LinearCostModel.

A profile is saved as JSON (`cadence sim calibrate --out FILE`) so later simulations need no
model and no torch:

    {"machine": "...", "samples": [{"decodes": 4, "decode_ctx": 64, "chunk": 128,
                                    "chunk_start": 0, "seconds": 0.41}, ...]}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cadence.core.plan import StepPlan
from cadence.core.step_cost import CURVE_MIN_TOKENS, StepFeatures, fit_coefficients
from cadence.core.step_profile import plans_of_rows, profile_rows
from cadence.sim.cost_model import LinearCostModel, StackRowCurve

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
    model.stack_rows = stack_row_curve(stack)
    # Prompt tokens cost per token what the profile measured at the step's row count: chunks
    # of 128-256 tokens cost 10-20% more per token than a document's 1000-token chunk on the
    # Zen 3 host, 64-128 another 20-40% on Zen 4.
    model.prompt_token_curve = rows_token_curve(per_op if len(per_op) >= 3 else features,
                                                model.prompt_step_time)
    return model


def rows_token_curve(samples: list[tuple[StepFeatures, float]], predict) -> tuple[tuple[int, float], ...]:
    """(step rows, seconds per prompt token) from the profile's steps with at least
    CURVE_MIN_TOKENS prompt tokens: the step's time less what the fit gives all but its prompt
    tokens (fixed costs, decode rows, attention), per prompt token; the median per row count.
    Unlike the slo floor's curve (lone chunks from position 0, by chunk size) it takes every
    such step, so the mixed chunks of 64-128 tokens price the small end (below the lone 256,
    the curve had nothing and held 256's cost: a 128-token chunk came out 13-17% short)."""
    by_rows: dict[int, list[float]] = {}
    for f, seconds in samples:
        n = f.prefill_tokens
        if n < CURVE_MIN_TOKENS or not (isinstance(seconds, (int, float)) and seconds > 0):
            continue
        others = predict(dataclasses.replace(f, prefill_tokens=0))
        per_token = (seconds - others) / n
        if per_token > 0:
            by_rows.setdefault(f.num_tokens, []).append(per_token)
    return tuple((rows, sorted(v)[len(v) // 2]) for rows, v in sorted(by_rows.items()))


def stack_row_curve(stack: list[tuple[StepFeatures, float]]) -> StackRowCurve | None:
    """The fused stack's cost by row count (StackRowCurve) from the profile's stack steps: the
    per-pair cost from two decode steps of one row count at two contexts, each step's time less
    its attention as a point (the median where a row count was timed at several contexts).
    None without such a pair (the linear fit then prices stack steps)."""
    by_rows: dict[int, list[tuple[int, float]]] = {}
    for f, seconds in stack:
        if isinstance(seconds, (int, float)) and seconds > 0:
            by_rows.setdefault(f.num_tokens, []).append((f.attention_pairs, seconds))
    slopes = []
    for pts in by_rows.values():
        lo, hi = min(pts), max(pts)
        if hi[0] > lo[0]:
            slopes.append(max(0.0, (hi[1] - lo[1]) / (hi[0] - lo[0])))
    if not slopes:
        return None
    per_pair = sorted(slopes)[len(slopes) // 2]
    points = []
    for rows, pts in by_rows.items():
        costs = sorted(s - per_pair * pairs for pairs, s in pts)
        points.append((rows, max(0.0, costs[len(costs) // 2])))
    return StackRowCurve(points, per_pair)


def save_profile(path: str | Path, samples: Samples, machine: str = "",
                 rounds: list[list[float]] | None = None) -> None:
    """Write a profile; `rounds` (each sample's seconds per round, in the samples' order) keeps
    the host's spread for a simulation with step jitter (`cadence sim --step-jitter`)."""
    rows = profile_rows(samples)
    if rounds is not None:
        if len(rounds) != len(rows):
            raise ValueError("rounds must give one list of seconds per sample")
        for row, times in zip(rows, rounds):
            row["rounds"] = list(times)
    Path(path).write_text(json.dumps({"machine": machine, "samples": rows}, indent=2))


def load_profile(path: str | Path, block_size: int = 16) -> Samples:
    """The (plan, seconds) samples of a saved profile. ValueError on a malformed file."""
    return [(plan, seconds) for plan, seconds, _ in _load_rows(path, block_size)]


def load_profile_rounds(path: str | Path, block_size: int = 16) -> list[tuple[StepPlan, list[float]]]:
    """(plan, seconds per round) of a saved profile; empty when it was saved without rounds.
    ValueError on a malformed file."""
    rows = _load_rows(path, block_size)
    if not all(times for _, _, times in rows):
        return []
    return [(plan, times) for plan, _, times in rows]


def _load_rows(path: str | Path, block_size: int) -> list[tuple[StepPlan, float, list[float]]]:
    try:
        data = json.loads(Path(path).read_text())
        samples = []
        for row in data["samples"]:
            built = plans_of_rows([row], block_size)
            if built:
                samples.append((*built[0], [float(t) for t in row.get("rounds", ())]))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a cadence step profile: {exc}") from exc
    if not samples:
        raise ValueError(f"{path}: the profile holds no usable samples")
    return samples
