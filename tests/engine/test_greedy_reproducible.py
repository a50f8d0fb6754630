"""Greedy output is reproducible on the default model with default settings (issue 13).

12 prompts (sharing a long prefix, so the prefix cache changes how later runs split them) run
in one batch, again (now with prefix-cache hits), a few one at a time, and under a KV pool
small enough to preempt: every run gives the same texts.

The guarantee holds bit for bit in float32 compute on the packed kernels, the default on CPU
(int4 for the default Q4_1 GGUF, int8 for float models without native bf16; issue 31: every
kernel gives a row the same arithmetic whatever else its step holds,
test_batch_invariant_default.py). Where `auto` resolves to bf16 compute (float models on CPUs
with native bf16), near-tied logits can still flip with the chunk split, so this test then turns
on `deterministic=True` (`--deterministic`: float32), as the README says.
"""

from __future__ import annotations

import pytest

from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from tests.engine.conftest import fix_step_costs

pytestmark = pytest.mark.slow

PREFIX = ("You are a careful assistant. Answer in one short paragraph, plainly, without lists. "
          "Think about what the question really asks before you answer it. ")
QUESTIONS = [
    "Why is the sky blue?", "What is a prime number?", "How do bees make honey?",
    "Why do we have seasons?", "What does a compiler do?", "How does a refrigerator work?",
    "What is photosynthesis?", "Why does ice float on water?", "What causes tides?",
    "How do vaccines work?", "What is inflation in economics?", "Why do cats purr?",
]
MAX_TOKENS = 24


def _default_config(**overrides) -> EngineConfig:
    from cadence.model.loader import default_model_path, file_weight_format, resolve_device, resolve_dtype

    cfg = EngineConfig(**overrides)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    # A GGUF whose own integer layers `auto` keeps computes in float32 whatever the CPU.
    if dtype.itemsize < 4 and not file_weight_format(cfg.model or default_model_path(), device):
        # bf16/fp16 compute by default on this machine: the guarantee is --deterministic's.
        cfg = EngineConfig(deterministic=True, **overrides)
    return cfg


@pytest.fixture(scope="module")
def loaded():
    from cadence.model.loader import load_model

    cfg = _default_config()
    return load_model(cfg.model, dtype=cfg.model_dtype, device=cfg.device)


def _run(llm: LLM, prompts: list[str]) -> list[str]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    assert all(r.outputs[0].error is None for r in results)
    return [r.outputs[0].text for r in results]


@pytest.mark.timeout(900)
def test_greedy_is_reproducible_across_cache_state_batches_and_preemption(loaded):
    prompts = [PREFIX + q for q in QUESTIONS]
    engine = LLMEngine.from_loaded(loaded, _default_config())
    llm = LLM.from_engine(engine)
    first = _run(llm, prompts)
    second = _run(llm, prompts)  # prefix-cache hits: other chunk splits
    assert engine.scheduler.stats().prefix_cache_hits > 0
    solo = [_run(llm, [p])[0] for p in prompts[:3]]  # batches of one
    engine.close()
    assert second == first
    assert solo == first[:3]

    # A pool of 20 blocks of 16 (320 tokens) cannot hold 12 requests of ~45 prompt tokens
    # (2 blocks of them shared) + 24: the scheduler preempts and recomputes. The slo policy
    # plans on its prior step-cost model here: from a loaded host's step times it would
    # admit fewer prompts at once, and whether they collide would depend on the machine.
    from cadence.core.config import CacheConfig

    small = fix_step_costs(LLMEngine.from_loaded(loaded, _default_config(
        cache=CacheConfig(num_blocks=20), startup_profile=False)))
    preempted = _run(LLM.from_engine(small), prompts)
    assert small.scheduler.stats().num_preemptions_total > 0
    small.close()
    assert preempted == first
