"""Prompt logprobs (SamplingParams.prompt_logprobs) against a full-sequence transformers forward.

Every prompt token after the first gets the logprob of the model's log_softmax at the position
before it, its rank in the whole vocabulary and the top k, whatever the chunking (a token
budget of 16 cuts prompts into chunks, the fused stack's and the per-op path's), the prefix
cache (a request asking for them takes no hits, but publishes its blocks), the batch (other
requests' tokens stay those of a run without it) and preemption (recompute neither doubles nor
loses an entry).
"""

from __future__ import annotations

import pytest
import torch

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.engine.config import EngineConfig
from cadence.engine.llm import LLM
from cadence.engine.llm_engine import LLMEngine
from cadence.model.loader import load_model
from tests.engine.conftest import fix_step_costs

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores keys and values in fixed-size blocks.",
    "def forward(self, x):",
]
K = 5
TOL = 2e-3  # float32 kernels against transformers' torch forward


@pytest.fixture(scope="module")
def loaded(tiny_llama_d64_dir):
    return load_model(tiny_llama_d64_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def hf_logprobs(tiny_llama_d64_dir, loaded):
    """prompt -> (token ids, log_softmax [P, V] float32 of one full-sequence forward)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_llama_d64_dir, dtype=torch.float32).eval()
    out = {}
    for prompt in PROMPTS:
        ids = loaded.tokenizer.encode(prompt)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()  # [P, V]
        out[prompt] = (ids, logits.log_softmax(dim=-1))
    return out


def engine_for(loaded, *, budget=8192, prefix=False, num_blocks=None, block_size=16,
               policy="chunked", max_seqs=8, swap_blocks=0) -> LLMEngine:
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=budget,
                                  max_num_seqs=max_seqs),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                          enable_prefix_caching=prefix, num_swap_blocks=swap_blocks),
        startup_profile=False)
    return fix_step_costs(LLMEngine.from_loaded(loaded, cfg))


def params(k=K, max_tokens=4):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          prompt_logprobs=k)


def check_against_hf(entries, ids, ref, k):
    """entries: RequestOutput.prompt_logprobs; ids, ref: the prompt and its log_softmax."""
    assert len(entries) == len(ids) and entries[0] is None
    for p in range(1, len(ids)):
        entry, row, tok = entries[p], ref[p - 1], ids[p]
        assert tok in entry, p
        lp = entry[tok]
        assert lp.logprob == pytest.approx(row[tok].item(), abs=TOL)
        # Its rank in the whole vocabulary (ties within the tolerance may go either way).
        assert int((row > row[tok] + TOL).sum()) + 1 <= lp.rank <= int((row > row[tok] - TOL).sum()) + 1
        others = {t: v for t, v in entry.items() if t != tok or v.rank <= k}
        top = sorted(others.items(), key=lambda kv: kv[1].rank)[:k]
        assert [v.rank for _, v in top] == list(range(1, k + 1))
        kth = row.topk(k).values  # [k]
        for rank, (t, v) in enumerate(top):
            assert v.logprob == pytest.approx(row[t].item(), abs=TOL)
            assert v.logprob == pytest.approx(kth[rank].item(), abs=TOL)
        assert len(entry) in (k, k + 1)


def prompt_entries(loaded, prompts, sampling, **engine_kw):
    engine = engine_for(loaded, **engine_kw)
    results = LLM.from_engine(engine).generate(prompts, sampling)
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_blocks_used == 0
    return results, engine


@pytest.mark.parametrize("budget", [8192, 16])
def test_prompt_logprobs_match_a_full_forward(loaded, hf_logprobs, budget):
    """Whole prompts, and chunks of 16 (the last row of each chunk predicts the next one's
    first token), both paths of the forward."""
    results, _ = prompt_entries(loaded, PROMPTS, params(), budget=budget)
    for prompt, result in zip(PROMPTS, results):
        ids, ref = hf_logprobs[prompt]
        assert result.prompt_token_ids == ids
        check_against_hf(result.prompt_logprobs, ids, ref, K)


def test_k0_holds_only_the_prompt_token(loaded, hf_logprobs):
    results, _ = prompt_entries(loaded, PROMPTS[:1], params(k=0), budget=16)
    ids, ref = hf_logprobs[PROMPTS[0]]
    entries = results[0].prompt_logprobs
    assert entries[0] is None and len(entries) == len(ids)
    for p in range(1, len(ids)):
        assert list(entries[p]) == [ids[p]]
        assert entries[p][ids[p]].logprob == pytest.approx(ref[p - 1, ids[p]].item(), abs=TOL)
        assert entries[p][ids[p]].rank >= 1


def test_prefix_cache_serves_no_hits_but_keeps_every_entry(loaded, hf_logprobs):
    """The same prompt twice on one engine with prefix caching: the second still gets every
    entry (it takes no hits); a third request without prompt logprobs hits the blocks the
    first two published."""
    engine = engine_for(loaded, budget=16, prefix=True, block_size=4)
    llm = LLM.from_engine(engine)
    prompt = PROMPTS[0]
    ids, ref = hf_logprobs[prompt]
    first = llm.generate([prompt], params())[0]
    second = llm.generate([prompt], params())[0]
    check_against_hf(second.prompt_logprobs, ids, ref, K)
    assert second.num_cached_tokens == 0
    assert [{t: v.logprob for t, v in e.items()} for e in first.prompt_logprobs[1:]] == \
        [{t: v.logprob for t, v in e.items()} for e in second.prompt_logprobs[1:]]
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4,
                                                  ignore_eos=True))[0]
    assert plain.num_cached_tokens > 0 and plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == first.outputs[0].token_ids


def test_other_requests_in_the_batch_are_unchanged(loaded, hf_logprobs):
    """One request scores its prompt beside two that do not: their tokens are those of a run
    without it, and its own tokens those of a run without prompt logprobs."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    alone, _ = prompt_entries(loaded, PROMPTS, greedy, budget=16)
    mixed, _ = prompt_entries(loaded, PROMPTS, [greedy, params(max_tokens=8), greedy],
                              budget=16)
    assert [r.outputs[0].token_ids for r in mixed] == [r.outputs[0].token_ids for r in alone]
    assert mixed[0].prompt_logprobs is None and mixed[2].prompt_logprobs is None
    ids, ref = hf_logprobs[PROMPTS[1]]
    check_against_hf(mixed[1].prompt_logprobs, ids, ref, K)


@pytest.mark.parametrize("swap_blocks", [0, 64])
def test_entries_survive_preemption(loaded, hf_logprobs, swap_blocks):
    """A pool too small for the batch: requests are preempted, then recomputed (mid-prompt
    too, with chunks of 8) or swapped back in; every request still has exactly one entry per
    prompt token."""
    lengths = [len(hf_logprobs[p][0]) for p in PROMPTS]
    block = 4
    num_blocks = max(-(-(n + 8) // block) for n in lengths) + 2
    results, engine = prompt_entries(loaded, PROMPTS * 2, params(max_tokens=8), budget=8,
                                     block_size=block, num_blocks=num_blocks, prefix=True,
                                     swap_blocks=swap_blocks)
    stats = engine.scheduler.stats()
    assert stats.num_preemptions_total > 0
    if swap_blocks:
        assert stats.num_swap_preemptions_total > 0
    for prompt, result in zip(PROMPTS * 2, results):
        ids, ref = hf_logprobs[prompt]
        check_against_hf(result.prompt_logprobs, ids, ref, K)


def test_n_completions_share_the_first_ones_entries(loaded, hf_logprobs):
    sampling = SamplingParams(temperature=0.8, seed=3, max_tokens=4, n=3, prompt_logprobs=2)
    results, _ = prompt_entries(loaded, PROMPTS[1:2], sampling, budget=16, prefix=True)
    ids, ref = hf_logprobs[PROMPTS[1]]
    assert len(results[0].outputs) == 3
    check_against_hf(results[0].prompt_logprobs, ids, ref, 2)


@pytest.mark.parametrize("bad", [21, -1])
def test_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
