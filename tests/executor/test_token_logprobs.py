"""score_tokens: the one reduction behind sampled-token logprobs and prompt logprobs."""

import torch

from cadence.executor.token_logprobs import score_tokens


def test_scores_match_a_direct_reading_of_each_row():
    gen = torch.Generator().manual_seed(0)
    logprobs = torch.randn(5, 50, generator=gen).log_softmax(dim=-1)  # [R, V]
    ids = [3, 0, 49, 17, 17]
    scores = score_tokens(logprobs, ids, 4, with_ranks=True)
    for r, token in enumerate(ids):
        row = logprobs[r]
        assert scores.logprobs[r] == row[token].item()
        order = sorted(range(50), key=lambda t: -row[t].item())
        assert scores.ranks[r] == order.index(token) + 1  # no ties in random floats
        assert scores.top_ids[r] == order[:4]
        assert scores.top_values[r] == [row[t].item() for t in order[:4]]


def test_ties_rank_together_and_k_zero_gives_no_alternatives():
    logprobs = torch.tensor([[-1.0, -0.5, -0.5, -2.0]])  # [1, 4]: two tokens tie at the top
    scores = score_tokens(logprobs, [2], 0, with_ranks=True)
    assert scores.ranks == [1]  # only strictly likelier tokens count
    assert scores.top_ids == [[]] and scores.top_values == [[]]
    assert score_tokens(logprobs, [0], 0).ranks is None  # the sampler does not pay for ranks
    assert score_tokens(logprobs, [0], 0, with_ranks=True).ranks == [3]
