"""The simulator calibrated from a profile of the machine, and the validation against the
real engine (on a tiny random model here; the numbers for the real model are in the README)."""

from __future__ import annotations

import json

import pytest

from cadence.core.step_cost import StepCostCoefficients, StepFeatures
from cadence.core.step_profile import DEFAULT_SHAPES, ProfileShape, build_plan
from cadence.sim.calibration import cost_model_from_samples, load_profile, load_profile_rounds
from cadence.sim.calibration import save_profile
from cadence.sim.cli import main

# A pair against cached context costs what a causal pair costs (one flash kernel serves both:
# the model holds the context-pair term at 0, core/step_cost.py).
MACHINE = StepCostCoefficients(0.02, 0.002, 0.004, 6e-7, 0.0)


def machine_seconds(plan) -> float:
    f = StepFeatures.of_plan(plan)
    return (MACHINE.base_s + MACHINE.per_prefill_token_s * f.prefill_tokens
            + MACHINE.per_decode_token_s * f.decode_tokens
            + MACHINE.per_attention_pair_s * f.attention_pairs
            + MACHINE.per_context_pair_s * f.context_pairs)


def profile():
    plans = [build_plan(s, 16, 1 << 20) for s in DEFAULT_SHAPES]
    return [(p, machine_seconds(p)) for p in plans]


def test_a_profile_recovers_the_machine_and_survives_a_round_trip(tmp_path):
    samples = profile()
    model = cost_model_from_samples(samples)
    # Some terms are weakly separable (a chunk's own attention pairs are a few percent of its
    # time; prompt steps carry 0 or 4 decodes), so check what the fit predicts: the profile's
    # steps, a held-out continuing chunk late in a document and a decode batch.
    held_out = build_plan(ProfileShape(decodes=3, chunk=200, chunk_start=1800), 16, 1 << 20)
    decodes = build_plan(ProfileShape(decodes=6, decode_ctx=300), 16, 1 << 20)
    for plan, _ in samples + [(held_out, None), (decodes, None)]:
        assert model.step_time(plan) == pytest.approx(machine_seconds(plan), rel=0.01)
    path = tmp_path / "profile.json"
    save_profile(path, samples, machine="test")
    again = load_profile(path)
    assert [p.chunks for p, _ in again] == [p.chunks for p, _ in samples]
    assert cost_model_from_samples(again).coefficients == model.coefficients


def test_a_bad_profile_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('{"samples": [{"decodes": "x"}]}')
    with pytest.raises(ValueError, match="not a cadence step profile"):
        load_profile(path)
    assert main(["--calibration", str(path)]) == 2
    assert "not a cadence step profile" in capsys.readouterr().err


def test_validation_runs_the_same_workloads_on_the_engine_and_in_the_simulator(
        tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "validation.json"
    saved = tmp_path / "profile.json"
    assert main(["--validate", "--model", tiny_llama_dir, "--dtype", "float32",
                 "--validate-scale", "0.1", "--json", str(out),
                 "--save-calibration", str(saved)]) == 0
    text = capsys.readouterr().out
    assert "simulator vs real engine" in text and "p99 ITL" in text
    rows = json.loads(out.read_text())["rows"]
    assert len({r["case"] for r in rows}) >= 6
    ttft = [r for r in rows if r["metric"] == "mean TTFT"]
    assert all(r["real_s"] > 0 and r["sim_s"] > 0 for r in ttft)
    # The saved profile drives a plain simulation without the model, with the host's spread
    # too (the profile keeps its rounds).
    plain = ["--calibration", str(saved), "--streams", "2", "--doc-tokens", "256",
             "--stream-output", "20", "--budgets", "64", "--targets", "100"]
    assert main(plain) == 0
    assert "calibrated" in capsys.readouterr().out
    assert len(load_profile_rounds(saved)[0][1]) == 5
    assert main(plain + ["--step-jitter"]) == 0
    assert "vary as the profile's rounds did" in capsys.readouterr().out


def test_step_jitter_needs_a_profile_with_rounds(tmp_path, capsys):
    samples = profile()
    path = tmp_path / "medians.json"
    save_profile(path, samples, machine="test")  # medians only
    assert load_profile_rounds(path) == []
    assert main(["--calibration", str(path), "--step-jitter"]) == 2
    assert "--step-jitter needs a profile with its rounds" in capsys.readouterr().err
    with_rounds = tmp_path / "rounds.json"
    save_profile(with_rounds, samples, rounds=[[s, s * 1.2, s * 0.9] for _, s in samples])
    again = load_profile_rounds(with_rounds)
    assert [t for _, t in again] == [pytest.approx([s, s * 1.2, s * 0.9]) for _, s in samples]
    assert [s for _, s in load_profile(with_rounds)] == [s for _, s in samples]
    with pytest.raises(ValueError, match="one list of seconds per sample"):
        save_profile(tmp_path / "x.json", samples, rounds=[[1.0]])


def test_decode_only_steps_are_fitted_apart_from_prompt_steps():
    """Decode-only steps and short chunks take another executor path (the fused stack: small
    fixed cost) than steps with a longer chunk; the calibrated simulator prices each by its
    own fit."""
    stack = StepCostCoefficients(0.004, 0.0025, 0.003, 1e-8)

    def seconds(plan) -> float:
        f = StepFeatures.of_plan(plan)
        if f.prompt_step:
            return machine_seconds(plan) + 0.06  # the per-op path's fixed cost
        return (stack.base_s + stack.per_prefill_token_s * f.prefill_tokens
                + stack.per_decode_token_s * f.decode_tokens + stack.per_attention_pair_s * f.attention_pairs)

    samples = [(p, seconds(p)) for p, _ in profile()]
    model = cost_model_from_samples(samples)
    assert model.decode_only is not None
    three_decodes = build_plan(ProfileShape(decodes=3), 16, 1 << 20)
    assert model.step_time(three_decodes) == pytest.approx(seconds(three_decodes), rel=0.02)
    # A chunk of 40 tokens leaves the stack: the per-op path's fixed cost, which a 32-token
    # chunk does not pay.
    forty = build_plan(ProfileShape(chunk=40), 16, 1 << 20)
    assert model.step_time(forty) == pytest.approx(seconds(forty), rel=0.02)
    assert seconds(forty) > seconds(build_plan(ProfileShape(chunk=32), 16, 1 << 20)) + 0.05
    for plan, want in samples:
        assert model.step_time(plan) == pytest.approx(want, rel=0.02)


def test_prompt_chunks_are_priced_on_the_profiles_per_token_curve():
    """A machine where a prompt token costs more in a chunk of <= 256 tokens than in a larger
    one (on CPU: the int8 kernel of small row counts vs torch's float32 GEMM): the calibrated
    simulator prices lone chunks at the profiled sizes as measured, which one linear
    per-token term cannot (it splits the difference)."""
    extra = 0.001  # seconds per token in chunks <= 256

    def seconds(plan):
        sizes = [c.num_new_tokens for c in plan.chunks if c.is_prefill]
        return machine_seconds(plan) + extra * sum(n for n in sizes if n <= 256)

    plans = [build_plan(s, 16, 1 << 20) for s in DEFAULT_SHAPES]
    model = cost_model_from_samples([(p, seconds(p)) for p in plans])
    # Points by the step's row count, from every profiled step with >= 64 prompt tokens (mixed
    # steps of 64-128-token chunks included).
    rows = [n for n, _ in model.prompt_token_curve]
    assert {256, 512, 1024} <= set(rows) and min(rows) < 256
    for n in (256, 1024):
        plan = build_plan(ProfileShape(chunk=n), 16, 1 << 20)
        assert model.step_time(plan) == pytest.approx(seconds(plan), rel=0.05)
    mixed = build_plan(ProfileShape(decodes=3, chunk=120, chunk_start=200), 16, 1 << 20)
    assert model.step_time(mixed) == pytest.approx(seconds(mixed), rel=0.05)
    # Short chunks (below the curve) keep the linear term; decode steps are untouched.
    decodes = build_plan(ProfileShape(decodes=6, decode_ctx=300), 16, 1 << 20)
    assert model.step_time(decodes) == pytest.approx(seconds(decodes), rel=0.05)
