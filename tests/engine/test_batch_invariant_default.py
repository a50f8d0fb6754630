"""Greedy results of the default model in DEFAULT settings do not depend on the step (issue 31).

SmolLM2-135M from its Q4_1 file with `--quantization auto` (int4 weights, int8-quantized
activations, float32 compute), no `--deterministic`. 12 prompts of mixed lengths (a dozen to
~300 tokens: prompt chunks of the fused stack's size and longer, contexts past one 256-position
attention span) are run

- alone, one at a time (prefix cache off: each prompt prefilled whole),
- inside one batch with 16 random other requests (big per-op steps, decode batches of 28),
- twice through a prefix cache with small chunks (the second run starts from cached blocks),
- under a KV pool so small that requests are preempted and recomputed,

The last two prompts also run with seeded sampling, n=3. Every run must give the same tokens
and the same sampled-token logprobs, bit for bit (a
logprob is the logit minus the row's log-sum-exp, so equal logprobs mean equal logit rows in
practice). The Makefile runs this file again with the AVX2 kernel tier forced.
"""

from __future__ import annotations

import random

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from tests.engine.conftest import fix_step_costs

MAX_TOKENS = 24
WORDS = ("the model reads every token once and writes its keys and values into paged blocks while "
         "a scheduler decides which requests run in each step under a budget of tokens so that "
         "streams keep flowing when a long document arrives and the cache fills up").split()
SHARED = "You are a careful assistant. Answer in one short paragraph, plainly, without lists. "
QUESTIONS = [
    "Why is the sky blue?", "What is a prime number?", "How do bees make honey?",
    "Why do we have seasons?", "What does a compiler do?", "How does a refrigerator work?",
    "What is photosynthesis?", "Why does ice float on water?", "What causes tides?",
    "How do vaccines work?", "What is inflation in economics?", "Why do cats purr?",
]
# Words of filler before each question: prompts of ~10 to ~300 tokens.
FILLER_WORDS = (0, 6, 20, 35, 50, 70, 90, 120, 150, 190, 240, 280)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _prompts() -> list[str]:
    rng = random.Random(31)
    # Half of them share SHARED (prefix-cache hits across prompts, not only across runs).
    return [(SHARED if i % 2 else "") + _words(rng, n) + " " + q
            for i, (n, q) in enumerate(zip(FILLER_WORDS, QUESTIONS))]


def _others(count: int) -> tuple[list[str], list[SamplingParams]]:
    rng = random.Random(7)
    prompts = [_words(rng, rng.randint(3, 200)) for _ in range(count)]
    params = [SamplingParams(max_tokens=rng.randint(4, 40), temperature=rng.choice([0.0, 0.8]),
                             seed=rng.randint(0, 1000), ignore_eos=True) for _ in range(count)]
    return prompts, params


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)
# Seeded sampling with n > 1: each completion draws from (seed, its index), so once logits are
# bit-identical its tokens are too.
SEEDED = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=1234, n=3, ignore_eos=True,
                        logprobs=0)
NUM_SEEDED = 2  # the last two prompts also run seeded


def _results(outputs) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """(token ids, sampled-token logprobs) per completion, request by request."""
    out = []
    for r in outputs:
        for c in r.outputs:
            assert c.error is None
            out.append((tuple(c.token_ids), tuple(s.logprob for s in c.sampled)))
    return out


def _requests(prompts: list[str]) -> tuple[list[str], list[SamplingParams]]:
    """The 12 greedy requests, then the seeded ones."""
    seeded = prompts[-NUM_SEEDED:]
    return [*prompts, *seeded], [*[GREEDY] * len(prompts), *[SEEDED] * len(seeded)]


def _engine(loaded, *, prefix: bool = True, budget: int | None = None, policy: str = "slo",
            num_blocks: int = 400, fixed_step_costs: bool = False) -> LLMEngine:
    # 400 blocks of 16 (~290 MiB of KV): room for every request of a run at once, and no
    # dependence on how much memory the machine has free (the default pool is sized from it).
    # fixed_step_costs: the slo policy plans on its prior step-cost model (no startup profile,
    # no learning), so whether requests collide in a small pool does not follow this host's
    # step times.
    cfg = EngineConfig(scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=budget),
                       cache=CacheConfig(enable_prefix_caching=prefix, num_blocks=num_blocks),
                       startup_profile=not fixed_step_costs)
    assert not cfg.deterministic
    engine = LLMEngine.from_loaded(loaded, cfg)
    return fix_step_costs(engine) if fixed_step_costs else engine


@pytest.fixture(scope="module")
def loaded():
    from cadence.model.loader import load_model

    cfg = EngineConfig()  # the defaults: default model, dtype auto, quantization auto
    return load_model(cfg.model, dtype=cfg.model_dtype, device=cfg.device)


def _differ(a, b) -> list[int]:
    assert len(a) == len(b)
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


@pytest.mark.timeout(1800)
def test_greedy_is_bit_identical_alone_batched_cached_and_preempted(loaded):
    assert getattr(loaded.model, "decode_weight_format", None) in ("int4", "int8", "gguf", "bf16", "float32")
    prompts, params = _requests(_prompts())

    engine = _engine(loaded, prefix=False)
    llm = LLM.from_engine(engine)
    alone = [res for p, sp in zip(prompts, params) for res in _results(llm.generate([p], sp, use_tqdm=False))]
    engine.close()
    assert len(alone) == 12 + 3 * NUM_SEEDED

    # In one batch with 16 random others (greedy and seeded sampling, other lengths).
    others, other_params = _others(16)
    engine = _engine(loaded)
    outs = LLM.from_engine(engine).generate([*others[:8], *prompts, *others[8:]],
                                            [*other_params[:8], *params, *other_params[8:]], use_tqdm=False)
    engine.close()
    assert _differ(_results(outs[8:8 + len(prompts)]), alone) == []

    # Small chunks, then the same prompts again from a warm prefix cache.
    engine = _engine(loaded, budget=40, policy="chunked")
    llm = LLM.from_engine(engine)
    cold = _results(llm.generate(prompts, params, use_tqdm=False))
    warm = _results(llm.generate(prompts, params, use_tqdm=False))
    assert engine.scheduler.stats().prefix_cache_hits > 0
    engine.close()
    assert _differ(cold, alone) == []
    assert _differ(warm, alone) == []

    # A pool of 40 blocks of 16 (640 positions) for ~1500 prompt tokens: preemption.
    engine = _engine(loaded, num_blocks=40, fixed_step_costs=True)
    preempted = _results(LLM.from_engine(engine).generate(prompts, params, use_tqdm=False))
    assert engine.scheduler.stats().num_preemptions_total > 0
    engine.close()
    assert _differ(preempted, alone) == []
