"""One token per row scored against its row's log-probabilities: the token's logprob, its rank
in the whole vocabulary and the row's top k. The sampler (logprobs of sampled tokens) and
prompt scoring (prompt_logprobs) both reduce a [R, V] log-softmax this way, so both report the
same numbers for the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenScores:
    logprobs: list[float]  # [R] the given token's logprob
    ranks: list[int] | None  # [R] 1 + the tokens strictly likelier; None when not asked
    top_ids: list[list[int]]  # [R][k] the row's k likeliest tokens, descending ([] rows at k=0)
    top_values: list[list[float]]  # [R][k] their logprobs


def score_tokens(
    logprobs: torch.Tensor, ids: Sequence[int], k: int, with_ranks: bool = False
) -> TokenScores:
    """logprobs: [R, V] log-softmax rows; ids: R token ids, one per row; k >= 0."""
    token = torch.tensor(list(ids), dtype=torch.int64, device=logprobs.device)  # [R]
    chosen = logprobs.gather(1, token.unsqueeze(1))  # [R, 1]
    ranks = None
    if with_ranks:
        # A full pass over [R, V]; counted as float32 (exact below 2**24 tokens): a bool
        # tensor's sum runs ~5x slower.
        ranks = [int(r) + 1 for r in (logprobs > chosen).float().sum(dim=-1).tolist()]
    top_ids: list[list[int]] = [[] for _ in ids]
    top_values: list[list[float]] = [[] for _ in ids]
    if k > 0:
        values, indices = logprobs.topk(k, dim=-1)  # [R, k] each, descending
        top_ids, top_values = indices.tolist(), values.tolist()
    return TokenScores(chosen.squeeze(1).tolist(), ranks, top_ids, top_values)
