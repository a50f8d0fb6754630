"""The simulator's step costs: roofline arithmetic, profiles, the trace-fitted model."""

from __future__ import annotations

import json
import math

import pytest

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.core.step_cost import StepCostCoefficients
from cadence.sim.clock import VirtualClock
from cadence.sim.cost_model import LinearCostModel, RooflineCostModel
from cadence.sim.hardware import HardwareProfile, get_profile
from cadence.sim.model_shape import SMOLLM2_135M
from cadence.sim.trace_fit import fit_trace

CPU = get_profile("cpu-2core")


def chunk(req_id: str, start: int, n: int, decode: bool = False) -> ScheduledChunk:
    end = start + n
    return ScheduledChunk(
        req_id=req_id,
        token_ids=(5,) * n,
        start_pos=start,
        block_table=tuple(range(-(-end // 16))),
        sample=True,
        sampling=SamplingParams(),
        output_index=1 if decode else 0,
        is_prefill=not decode,
    )


def plan_of(*chunks: ScheduledChunk) -> StepPlan:
    return StepPlan(step_id=0, chunks=chunks, block_size=16)


def test_smollm2_shape_matches_the_published_size():
    # 135M parameters: 30 layers of 3.54M plus the tied 49152 x 576 embedding.
    assert SMOLLM2_135M.params_per_layer == 3_538_944
    total = SMOLLM2_135M.layer_params + SMOLLM2_135M.lm_head_params
    assert total == pytest.approx(134.5e6, rel=0.01)
    assert SMOLLM2_135M.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert SMOLLM2_135M.attention_flops_per_pair == 4 * 30 * 9 * 64


def test_roofline_of_one_decode_is_weights_over_bandwidth_plus_overhead():
    cost = RooflineCostModel(SMOLLM2_135M, CPU)
    m = SMOLLM2_135M
    t = cost.step_time(plan_of(chunk("a", 99, 1, decode=True)))
    expected = (
        CPU.step_overhead_s
        + (m.weight_bytes + 101 * m.kv_bytes_per_token) / CPU.memory_bandwidth_bytes_s
        + 2 * (m.layer_params + m.lm_head_params) / CPU.gemm_flops_s
        + m.attention_flops_per_pair * 100 / CPU.gemm_flops_s
    )
    assert t == pytest.approx(expected)
    assert 0.008 < t < 0.012  # ~6 ms of weights, ~0.7 ms of GEMM, 2 ms overhead


def test_roofline_prefill_is_compute_bound_and_late_chunks_cost_more():
    cost = RooflineCostModel(SMOLLM2_135M, CPU)
    early = cost.step_time(plan_of(chunk("doc", 0, 512)))
    late = cost.step_time(plan_of(chunk("doc", 3584, 512)))
    assert 0.25 < early < 0.45  # 512 tokens x 212 MFLOP at 380 GFLOP/s ~ 0.29 s
    assert late > 1.5 * early  # attention over 4k tokens of context
    whole = cost.step_time(plan_of(chunk("doc", 0, 4096)))
    assert whole > 3.0  # the stall eager imposes on every stream
    assert cost.step_time(plan_of()) == 0.0


def test_faster_hardware_is_faster():
    plan = plan_of(chunk("doc", 0, 512), chunk("a", 50, 1, decode=True))
    cpu = RooflineCostModel(SMOLLM2_135M, CPU).step_time(plan)
    gpu = RooflineCostModel(SMOLLM2_135M, get_profile("h200")).step_time(plan)
    assert gpu < cpu / 20


@pytest.mark.parametrize(
    "kwargs",
    [
        {"memory_bandwidth_bytes_s": 0, "gemm_flops_s": 1e9},
        {"memory_bandwidth_bytes_s": 1e9, "gemm_flops_s": -1},
        {"memory_bandwidth_bytes_s": 1e9, "gemm_flops_s": 1e9, "step_overhead_s": math.nan},
    ],
)
def test_profiles_reject_bad_rates(kwargs):
    with pytest.raises(ValueError):
        HardwareProfile(name="bad", **kwargs)


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="cpu-2core"):
        get_profile("tpu-v9")


def test_linear_cost_model_applies_its_coefficients():
    c = StepCostCoefficients(0.01, 0.001, 0.002, 1e-6)
    plan = plan_of(chunk("doc", 10, 4), chunk("a", 20, 1, decode=True))
    # doc: 4 prefill tokens, 4*10 + 10 pairs; a: 1 decode, 21 pairs.
    expected = 0.01 + 4 * 0.001 + 1 * 0.002 + (50 + 21) * 1e-6
    assert LinearCostModel(c).step_time(plan) == pytest.approx(expected)


def test_virtual_clock_only_moves_forward():
    clock = VirtualClock()
    assert clock() == 0.0
    assert clock.advance(0.5) == 0.5
    assert clock.advance_to(0.2) == 0.5  # never backwards
    assert clock.advance_to(2.0) == 2.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            clock.advance(bad)


def write_trace(path, steps):
    with open(path, "w") as f:
        for i, (prefill, decode, seconds) in enumerate(steps):
            record = {
                "type": "step",
                "step_id": i,
                "t_start": float(i),
                "t_end": float(i) + seconds + 0.001,
                "num_prefill_tokens": prefill,
                "num_decode_tokens": decode,
                "forward_time_s": seconds,
            }
            f.write(json.dumps(record) + "\n")
        f.write(json.dumps({"type": "request", "req_id": "x"}) + "\n")


def test_fit_trace_recovers_the_machine(tmp_path):
    steps = []
    for i in range(200):
        prefill = (i * 37) % 400 if i % 3 else 0
        decode = i % 9 + (0 if prefill else 1)
        steps.append((prefill, decode, 0.004 + 0.0003 * prefill + 0.0015 * decode))
    path = tmp_path / "trace.jsonl"
    write_trace(path, steps)
    model = fit_trace(path)
    c = model.coefficients
    assert c.base_s == pytest.approx(0.004, rel=0.1)
    assert c.per_prefill_token_s == pytest.approx(0.0003, rel=0.05)
    assert c.per_decode_token_s == pytest.approx(0.0015, rel=0.05)
    assert c.per_attention_pair_s == 0.0
    assert "trace.jsonl" in model.name


def test_fit_trace_refuses_thin_or_malformed_files(tmp_path):
    thin = tmp_path / "thin.jsonl"
    write_trace(thin, [(10, 1, 0.01)] * 3)
    with pytest.raises(ValueError, match="usable step records"):
        fit_trace(thin)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "step", "num_prefill_tokens": "many"}\n')
    with pytest.raises(ValueError, match="malformed"):
        fit_trace(bad)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    with pytest.raises(ValueError, match="not a JSON trace line"):
        fit_trace(garbage)
