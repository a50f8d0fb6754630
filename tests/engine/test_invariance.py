"""Invariant 1: scheduling never changes results.

Greedy fp32 outputs are token-for-token identical to one unchunked, unbatched run across policy
(eager / chunked), token budget {16, 64, 512, 8192}, max_num_seqs {1, 4, 64}, prefix cache on /
off, and a KV cache so small that requests get preempted and recomputed. On a tiny random model
(every combination) and on the real default model (@slow, a covering subset).
"""

from __future__ import annotations

import itertools

import pytest

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model
from tests.engine.conftest import fix_step_costs

POLICIES = ("eager", "chunked", "slo")
BUDGETS = (16, 64, 512, 8192)
MAX_SEQS = (1, 4, 64)
PREFIX = (True, False)

# Two prompts share a long prefix (several 16-token blocks) so the prefix cache gets hits.
SHARED = "Continuous batching mixes prefill chunks with decode steps under a token budget. " * 2
TINY_PROMPTS = [
    SHARED + "The quick brown fox",
    SHARED + "Hello world! How are you",
    "Paged attention stores keys and values in fixed-size blocks.",
    "def forward(self, x):",
    "Les modèles de langue prédisent le prochain jeton.",
]
NUM_TOKENS = 16
# Distinct prompts of similar length (~40 tokens) for the preemption runs.
PREEMPT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hello world! How are you today? I am fine, thank you. " * 3,
    "Paged attention stores keys and values in fixed-size blocks. " * 3,
    "def forward(self, x): return self.norm(x + self.attn(x)) " * 3,
]


GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)


def run(loaded, prompts, *, policy, budget, max_seqs, prefix, num_blocks=None, block_size=16,
        params=GREEDY, swap_blocks=0, fixed_step_costs=False):
    cfg = EngineConfig(
        scheduler=SchedulerConfig(
            policy=policy, max_num_batched_tokens=budget, max_num_seqs=max_seqs
        ),
        cache=CacheConfig(
            block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix,
            num_swap_blocks=swap_blocks,
        ),
        # A fixed cost model starts from the prior, not from this host's timed profile.
        startup_profile=not fixed_step_costs,
    )
    engine = LLMEngine.from_loaded(loaded, cfg)
    if fixed_step_costs:
        fix_step_costs(engine)
    results = LLM.from_engine(engine).generate(prompts, params)
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_blocks_used == 0
    return [r.outputs[0].token_ids for r in results], engine.scheduler.stats()


def reference(loaded, prompts):
    """One request at a time, whole prompt in one step, no cache reuse."""
    tokens, _ = run(loaded, prompts, policy="eager", budget=8192, max_seqs=1, prefix=False)
    assert all(len(t) == NUM_TOKENS for t in tokens)
    return tokens


def tight_cache_blocks(loaded, prompts, block_size):
    """A pool where each request fits alone but two admitted prompts leave no room to decode.

    Two prompts fit at once (so two run together), then their decodes need new blocks that
    are not there: preemption cannot be avoided, whatever the policy.
    """
    lengths = [len(loaded.tokenizer.encode(p)) for p in prompts]
    prompt_blocks = sorted(-(-n // block_size) for n in lengths)
    alone = max(-(-(n + NUM_TOKENS) // block_size) for n in lengths)
    return max(alone + 1, prompt_blocks[0] + prompt_blocks[1] + 1)


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def tiny_reference(tiny_loaded):
    return reference(tiny_loaded, TINY_PROMPTS)


@pytest.mark.parametrize(
    "policy,budget,max_seqs,prefix", list(itertools.product(POLICIES, BUDGETS, MAX_SEQS, PREFIX))
)
def test_tiny_model_outputs_do_not_depend_on_scheduling(
    tiny_loaded, tiny_reference, policy, budget, max_seqs, prefix
):
    tokens, stats = run(
        tiny_loaded, TINY_PROMPTS, policy=policy, budget=budget, max_seqs=max_seqs, prefix=prefix
    )
    assert tokens == tiny_reference
    if prefix and max_seqs == 1:
        # The second shared-prefix prompt is admitted after the first computed its blocks.
        assert stats.prefix_cache_hits > 0


@pytest.fixture(scope="module")
def tiny_preempt_reference(tiny_loaded):
    return reference(tiny_loaded, PREEMPT_PROMPTS)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("prefix", PREFIX)
@pytest.mark.parametrize("budget", (16, 512))
def test_tiny_model_outputs_survive_preemption(
    tiny_loaded, tiny_preempt_reference, policy, prefix, budget
):
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    tokens, stats = run(
        tiny_loaded, PREEMPT_PROMPTS, policy=policy, budget=budget, max_seqs=64, prefix=prefix,
        num_blocks=num_blocks, block_size=4, fixed_step_costs=True,
    )
    assert stats.num_preemptions_total > 0
    assert tokens == tiny_preempt_reference


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("prefix", PREFIX)
def test_tiny_model_outputs_survive_swap_preemption(tiny_loaded, tiny_preempt_reference, policy,
                                                    prefix):
    """Preempted requests' KV goes to the host tier and back (no recompute): same tokens."""
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    tokens, stats = run(
        tiny_loaded, PREEMPT_PROMPTS, policy=policy, budget=64, max_seqs=64, prefix=prefix,
        num_blocks=num_blocks, block_size=4, swap_blocks=256, fixed_step_costs=True,
    )
    assert stats.num_swap_preemptions_total > 0
    assert stats.num_blocks_swapped_in_total > 0
    assert tokens == tiny_preempt_reference


@pytest.mark.parametrize("policy", POLICIES)
def test_tiny_model_outputs_survive_priority_preemption(tiny_loaded, tiny_preempt_reference,
                                                        policy):
    """Two low-priority requests fill the sequence cap; urgent ones arrive while they decode,
    preempt them, start in the next step; everyone ends with the reference tokens."""
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=64, max_num_seqs=2,
                                  scheduling="priority"),
        cache=CacheConfig(block_size=4, num_blocks=256),
        # "Starts in the next step" needs a prompt chunk in that step: slo plans on its prior
        # cost model, not on this host's step times.
        startup_profile=False,
    )
    engine = fix_step_costs(LLMEngine.from_loaded(tiny_loaded, cfg))
    tokens: dict[str, list[int]] = {}
    for i in (0, 1):
        engine.add_request(f"low{i}", PREEMPT_PROMPTS[i], GREEDY, priority=5)
    steps = 0
    urgent_started = []
    while engine.has_unfinished():
        if steps in (3, 9):
            rid = f"urgent{steps}"
            engine.add_request(rid, PREEMPT_PROMPTS[2 + steps // 9], GREEDY, priority=0)
            outs = engine.step()
            # Started: part of its prompt (all of it, under a large enough budget) computed.
            urgent_started.append(engine.scheduler.get_request(rid).num_computed_tokens > 0)
        else:
            outs = engine.step()
        for o in outs:
            tokens.setdefault(o.req_id, []).extend(o.new_token_ids)
        steps += 1
    assert urgent_started == [True, True], "an urgent request starts in the next step"
    assert engine.scheduler.stats().num_preemptions_total >= 2
    got = [tokens["low0"], tokens["low1"], tokens["urgent3"], tokens["urgent9"]]
    assert got == [list(t) for t in tiny_preempt_reference]
    engine.scheduler.check_integrity()


def test_tiny_model_seeded_sampling_does_not_depend_on_scheduling(tiny_loaded):
    """Invariant 1 for random sampling: each request's seed fixes its tokens."""
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=NUM_TOKENS,
                       ignore_eos=True)
        for i in range(len(PREEMPT_PROMPTS))
    ]
    expected, _ = run(tiny_loaded, PREEMPT_PROMPTS, policy="eager", budget=8192, max_seqs=1,
                      prefix=False, params=params)
    greedy, _ = run(tiny_loaded, PREEMPT_PROMPTS, policy="eager", budget=8192, max_seqs=1,
                    prefix=False)
    assert expected != greedy  # the seeds really sample
    num_blocks = tight_cache_blocks(tiny_loaded, PREEMPT_PROMPTS, block_size=4)
    for policy, budget, max_seqs, prefix, blocks, bs in [
        ("chunked", 16, 64, True, None, 16),
        ("eager", 512, 4, False, None, 16),
        ("chunked", 64, 64, True, num_blocks, 4),
        ("eager", 64, 64, False, num_blocks, 4),
    ]:
        tokens, stats = run(tiny_loaded, PREEMPT_PROMPTS, policy=policy, budget=budget,
                            max_seqs=max_seqs, prefix=prefix, num_blocks=blocks, block_size=bs,
                            params=params)
        assert tokens == expected, (policy, budget, max_seqs, prefix, blocks)
        if blocks is not None:
            assert stats.num_preemptions_total > 0


# -- the real default model ----------------------------------------------------------------
REAL_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "In machine learning, a transformer is",
]
# Each dimension's values appear at least once; the last entries preempt.
REAL_CONFIGS = [
    dict(policy="chunked", budget=16, max_seqs=4, prefix=True),
    dict(policy="chunked", budget=64, max_seqs=64, prefix=False),
    dict(policy="eager", budget=512, max_seqs=4, prefix=True),
    dict(policy="chunked", budget=8192, max_seqs=1, prefix=True),
    dict(policy="eager", budget=16, max_seqs=64, prefix=False),
]


@pytest.fixture(scope="module")
def real_loaded(default_model_path):
    return load_model(default_model_path, dtype="float32", device="cpu")


@pytest.mark.slow
def test_real_model_outputs_do_not_depend_on_scheduling(real_loaded):
    expected = reference(real_loaded, REAL_PROMPTS)
    for cfg in REAL_CONFIGS:
        tokens, _ = run(real_loaded, REAL_PROMPTS, **cfg)
        assert tokens == expected, cfg
    num_blocks = tight_cache_blocks(real_loaded, REAL_PROMPTS, block_size=4)
    for policy in POLICIES:
        tokens, stats = run(
            real_loaded, REAL_PROMPTS, policy=policy, budget=64, max_seqs=64, prefix=True,
            num_blocks=num_blocks, block_size=4, fixed_step_costs=True,
        )
        assert stats.num_preemptions_total > 0, policy
        assert tokens == expected, policy
