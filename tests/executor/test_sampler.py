"""Sampler: greedy, filters, per-request seeds, logprobs, and the sampled distribution."""

from __future__ import annotations

import math

import pytest
import torch

from cadence.core.plan import ScheduledChunk
from cadence.core.sampling_params import SamplingParams
from cadence.executor.sampler import sample, seed_for

torch.set_num_threads(2)


def chunk(params: SamplingParams, req_id: str = "r", output_index: int = 0) -> ScheduledChunk:
    return ScheduledChunk(
        req_id=req_id,
        token_ids=(1,),
        start_pos=0,
        block_table=(0,),
        sample=True,
        sampling=params,
        output_index=output_index,
    )


def draw_many(logits_row: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n independent draws from one row, as one batch of n identical rows -> counts [V]."""
    gen = torch.Generator().manual_seed(1234)
    logits = logits_row.unsqueeze(0).expand(n, -1).contiguous()
    tokens = sample(logits, [chunk(params, f"r{i}") for i in range(n)], generator=gen)
    ids = torch.tensor([t.token_id for t in tokens])
    return torch.bincount(ids, minlength=logits_row.numel())


def test_greedy_is_argmax():
    logits = torch.randn(5, 100, generator=torch.Generator().manual_seed(0))
    out = sample(logits, [chunk(SamplingParams(temperature=0.0)) for _ in range(5)])
    assert [t.token_id for t in out] == logits.argmax(dim=-1).tolist()
    assert all(t.logprob is None and t.top_logprobs == () for t in out)


def test_given_greedy_ids_serve_greedy_rows_and_random_rows_still_draw():
    # The LM head kernel hands its argmax over: greedy rows take it as is, random rows draw as
    # without it (same generator state, same tokens), and a wrong shape is refused.
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)] * 2
    chunks = [chunk(p, f"r{i}") for i, p in enumerate(params)]
    marked = torch.tensor([7, 8, 9, 10])  # not the argmax: shows which source greedy rows used
    out = sample(logits, chunks, greedy=marked)
    plain = sample(logits, chunks)
    assert [out[0].token_id, out[2].token_id] == [7, 9]
    assert [out[1].token_id, out[3].token_id] == [plain[1].token_id, plain[3].token_id]
    assert marked.tolist() == [7, 8, 9, 10]  # not written to
    with pytest.raises(ValueError, match="greedy ids"):
        sample(logits, chunks, greedy=marked[:3])


def test_mixed_batch_keeps_greedy_rows_exact():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)] * 2
    out = sample(logits, [chunk(p) for p in params])
    argmax = logits.argmax(dim=-1).tolist()
    assert out[0].token_id == argmax[0] and out[2].token_id == argmax[2]


def test_top_k_restricts_support():
    logits = torch.linspace(0, 1, 20)  # the top 3 are ids 17, 18, 19
    counts = draw_many(logits, SamplingParams(temperature=5.0, top_k=3), 3000)
    assert set(torch.nonzero(counts).flatten().tolist()) == {17, 18, 19}


def test_top_p_restricts_support():
    # probs 0.5, 0.3, 0.1, 0.05, 0.05: top_p 0.75 keeps the smallest prefix reaching 0.75: {0, 1}
    probs = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
    counts = draw_many(probs.log(), SamplingParams(temperature=1.0, top_p=0.75), 3000)
    assert set(torch.nonzero(counts).flatten().tolist()) == {0, 1}


def test_min_p_restricts_support():
    # min_p 0.25 of max prob 0.5 -> threshold 0.125: keeps {0, 1}, drops 0.1 and below.
    probs = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
    counts = draw_many(probs.log(), SamplingParams(temperature=1.0, min_p=0.25), 3000)
    assert set(torch.nonzero(counts).flatten().tolist()) == {0, 1}


def test_filters_combine_per_row():
    """Each row gets its own filter in one batch: rows do not leak parameters into each other."""
    logits = torch.linspace(0, 1, 10).unsqueeze(0).expand(3, -1).contiguous()
    params = [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=0.0),
    ]
    gen = torch.Generator().manual_seed(0)
    seen: list[set[int]] = [set(), set(), set()]
    for _ in range(200):
        out = sample(logits, [chunk(p) for p in params], generator=gen)
        for row, tok in enumerate(out):
            seen[row].add(tok.token_id)
    assert seen[0] == {9}
    assert seen[1] == {8, 9}
    assert seen[2] == {9}


def test_distribution_matches_softmax():
    """Many draws on a small vocab: empirical frequencies match softmax(logits / T)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    temperature = 0.7
    n = 20000
    counts = draw_many(logits, SamplingParams(temperature=temperature), n).double()
    expected = (logits / temperature).softmax(dim=-1).double()
    # 5 sigma of a binomial proportion per token: fails by chance with negligible probability.
    sigma = (expected * (1 - expected) / n).sqrt()
    assert torch.all((counts / n - expected).abs() <= 5 * sigma + 1e-4), (counts / n, expected)


def test_distribution_after_top_k_is_renormalized():
    logits = torch.tensor([1.0, 0.8, 0.2, -0.5, -2.0])
    n = 20000
    counts = draw_many(logits, SamplingParams(temperature=1.0, top_k=2), n).double()
    expected = torch.zeros(5, dtype=torch.double)
    expected[:2] = logits[:2].double().softmax(dim=-1)
    sigma = (expected * (1 - expected) / n).sqrt()
    assert torch.all((counts / n - expected).abs() <= 5 * sigma + 1e-4)


def test_seeded_rows_ignore_batch_composition():
    vocab = 1000
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(vocab, generator=gen)
    params = SamplingParams(temperature=1.0, seed=42)

    alone = sample(target.unsqueeze(0), [chunk(params, "a", output_index=3)])[0].token_id
    for trial in range(5):
        others = torch.randn(6, vocab, generator=gen)
        batch = torch.cat([others[:trial], target.unsqueeze(0), others[trial:]])
        chunks = [chunk(SamplingParams(temperature=1.0), f"o{i}") for i in range(7)]
        chunks[trial] = chunk(params, "a", output_index=3)
        # A different engine RNG each time: the seeded row must not care.
        out = sample(batch, chunks, generator=torch.Generator().manual_seed(trial))
        assert out[trial].token_id == alone


def test_seeded_draws_vary_with_output_index_and_seed():
    logits = torch.zeros(1, 5000)  # uniform: distinct noise almost surely gives distinct tokens
    tokens = {
        sample(logits, [chunk(SamplingParams(seed=s), output_index=i)])[0].token_id
        for s in (1, 2)
        for i in range(10)
    }
    assert len(tokens) > 15
    assert seed_for(1, 0) != seed_for(0, 1)


def test_seeded_sequence_is_reproducible():
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=5)
    run1 = [sample(logits, [chunk(params, output_index=i)])[0].token_id for i in range(8)]
    run2 = [sample(logits, [chunk(params, output_index=i)])[0].token_id for i in range(8)]
    assert run1 == run2


def test_logprobs_are_raw_log_softmax():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 0.0, 5.0, 0.0]])
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.5, logprobs=0),
    ]
    out = sample(logits, [chunk(p) for p in params])
    raw = logits.log_softmax(dim=-1)
    assert out[0].token_id == 0
    assert out[0].logprob == pytest.approx(raw[0, 0].item())
    assert [t for t, _ in out[0].top_logprobs] == [0, 1]
    assert out[0].top_logprobs[1][1] == pytest.approx(raw[0, 1].item())
    # Temperature does not enter the reported logprob (OpenAI reports the model's distribution).
    assert out[1].logprob == pytest.approx(raw[1, out[1].token_id].item())
    assert out[1].top_logprobs == ()


def test_logprobs_only_for_rows_that_ask():
    logits = torch.randn(2, 10)
    out = sample(
        logits,
        [chunk(SamplingParams(temperature=0.0)), chunk(SamplingParams(temperature=0.0, logprobs=3))],
    )
    assert out[0].logprob is None
    assert len(out[1].top_logprobs) == 3
    assert sum(math.exp(lp) for _, lp in out[1].top_logprobs) <= 1.0 + 1e-6
    assert out[1].logprob == out[1].top_logprobs[0][1]  # greedy: the sampled token is the top one


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="rows"):
        sample(torch.zeros(2, 5), [chunk(SamplingParams())])
    with pytest.raises(ValueError, match="shape"):
        sample(torch.zeros(5), [chunk(SamplingParams())])
    assert sample(torch.zeros(0, 5), []) == []


def test_top_k_then_top_p_on_the_renormalized_rest():
    # top_k 3 leaves [0.5, 0.3, 0.1] / 0.9; mass before the third is 0.89 >= 0.7: {0, 1} stay.
    probs = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
    counts = draw_many(probs.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.7), 3000)
    assert set(torch.nonzero(counts).flatten().tolist()) == {0, 1}


def test_mixed_filters_in_one_batch_on_a_large_vocab():
    """Rows with min_p, top_k, top_p, top_k+top_p and none share a batch of a 5000-word vocab."""
    vocab = 5000
    base = torch.full((vocab,), -20.0)
    base[:4] = torch.tensor([3.0, 2.5, 2.0, 1.0])  # four plausible tokens, the rest negligible
    params = [
        SamplingParams(temperature=1.0, min_p=0.5),  # keeps p >= 0.5 * p(0): ids 0, 1
        SamplingParams(temperature=1.0, top_k=2),  # ids 0, 1
        SamplingParams(temperature=1.0, top_p=0.5),  # p(0) ~ 0.5 -> ids 0 (and maybe 1)
        SamplingParams(temperature=1.0, top_k=3, top_p=0.99),  # ids 0, 1, 2
        SamplingParams(temperature=1.0),  # any of the four (others ~e-23)
    ]
    logits = base.unsqueeze(0).expand(len(params), -1).contiguous()
    gen = torch.Generator().manual_seed(0)
    seen: list[set[int]] = [set() for _ in params]
    for _ in range(300):
        for row, tok in enumerate(sample(logits, [chunk(p) for p in params], generator=gen)):
            seen[row].add(tok.token_id)
    assert seen[0] == {0, 1}
    assert seen[1] == {0, 1}
    assert seen[2] <= {0, 1} and 0 in seen[2]
    assert seen[3] == {0, 1, 2}
    assert seen[4] <= {0, 1, 2, 3} and len(seen[4]) >= 3


def test_bad_words_of_several_tokens_ban_the_last_one_after_the_rest():
    """vLLM's rule: a word (5, 6, 7) bans 7 only where the output so far ends with 5, 6;
    prompt tokens do not count; one-token words (bad_words_token_ids) are banned always."""
    from cadence.core.plan import ScheduledChunk
    from cadence.core.sampling_params import SamplingParams
    from cadence.executor.logits_processors import apply_logits_processors

    params = SamplingParams(temperature=0, bad_words=("w",), bad_words_token_ids=(9,),
                            bad_words_sequences=((5, 6, 7), (3, 8)))
    logits = torch.zeros(1, 12)

    def banned(history, num_prompt):
        chunk = ScheduledChunk(req_id="r", token_ids=(history[-1],), start_pos=len(history) - 1,
                               block_table=(0,), sample=True, sampling=params, output_index=0,
                               is_prefill=False, history=history, num_prompt_tokens=num_prompt)
        out, _ = apply_logits_processors(logits, [chunk])
        return {i for i, v in enumerate(out[0].tolist()) if v == float("-inf")}

    assert banned([1, 2, 5, 6], num_prompt=2) == {9, 7}
    assert banned([1, 5, 6, 3], num_prompt=1) == {9, 8}
    assert banned([5, 6, 1], num_prompt=2) == {9}  # 5, 6 are in the prompt, then 1
    assert banned([1, 5, 6], num_prompt=2) == {9}  # only 6 is output: the prefix is not
