"""An engine's trace carries its startup profile (the meta line), and a scheduler seeded from
that line plans prompt chunks from the same prior as the engine's (what `cadence sim --compare`
does for each replica of a measured run)."""

from __future__ import annotations

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.scheduler import Scheduler
from cadence.core.step_profile import plans_of_rows
from cadence.engine.config import EngineConfig
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model
from cadence.telemetry.trace_writer import read_trace


def test_trace_meta_holds_the_startup_profile_the_slo_policy_plans_from(tiny_llama_dir, tmp_path):
    loaded = load_model(tiny_llama_dir, dtype="float32", device="cpu")
    path = tmp_path / "trace.jsonl"
    sched = SchedulerConfig(policy="slo", max_num_batched_tokens=2048, max_num_seqs=8)
    cache = CacheConfig(block_size=16, num_blocks=256)
    engine = LLMEngine.from_loaded(loaded, EngineConfig(scheduler=sched, cache=cache,
                                                        trace_path=str(path)))
    engine.close()
    meta = next(r for r in read_trace(path) if r["type"] == "meta")
    rows = meta["startup_profile"]
    assert len(rows) == len(engine.profile_samples) >= 8
    samples = plans_of_rows(rows, cache.block_size)
    assert [p.chunks for p, _ in samples] == [p.chunks for p, _ in engine.profile_samples]
    assert [s for _, s in samples] == [s for _, s in engine.profile_samples]

    replay = Scheduler(engine.scheduler.sched, cache)
    replay.calibrate(samples)
    mine, theirs = replay.policy.cost_model, engine.scheduler.policy.cost_model
    # Everything the prefill floor plans from (_ChunkPlan and its headroom).
    assert mine.prior_coefficients == theirs.prior_coefficients
    assert mine.prompt_token_curve == theirs.prompt_token_curve
    assert mine.calibration_error == theirs.calibration_error


def test_an_engine_without_a_profile_writes_an_empty_one(tiny_llama_dir, tmp_path):
    loaded = load_model(tiny_llama_dir, dtype="float32", device="cpu")
    path = tmp_path / "trace.jsonl"
    engine = LLMEngine.from_loaded(loaded, EngineConfig(
        scheduler=SchedulerConfig(policy="slo"), cache=CacheConfig(num_blocks=64),
        trace_path=str(path), startup_profile=False))
    engine.close()
    meta = next(r for r in read_trace(path) if r["type"] == "meta")
    assert meta["startup_profile"] == []
