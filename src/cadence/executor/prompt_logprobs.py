"""Prompt logprobs (vLLM's `prompt_logprobs`): the logprob, rank and top alternatives of every
prompt token, from the logits of the position before it.

A step computes logits only where it samples; a chunk that carries `prompt_targets` also runs
the LM head over its rows, here, after the forward: only those requests' rows pay for it, and
the other chunks' logits and tokens are untouched. Rows go through the head in pieces of
PIECE_ROWS, each reduced at once to the target's logprob, its rank in the whole vocabulary and
the top k, so no [prompt, vocab] tensor ever exists (an 8k prompt over a 49k vocabulary would
be 1.6 GB of float32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from cadence.core.plan import SampledToken, ScheduledChunk
from cadence.executor.token_logprobs import score_tokens

# Rows per LM-head call: [128, 49152] float32 logits are 25 MB (twice that with log_softmax).
PIECE_ROWS = 128


def prompt_logprobs(
    hidden: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    row_starts: Sequence[int],
    logits_of: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, tuple[int, tuple[SampledToken, ...]]]:
    """hidden: [T, H] final-norm hidden states of the step's rows; row_starts[i]: the first row
    of chunks[i]; logits_of: [R, H] -> [R, V] logits (the model's LM head, soft-cap included).

    Returns req_id -> (index of the first prompt token covered, its entries in order) for the
    chunks with prompt_targets."""
    out: dict[str, tuple[int, tuple[SampledToken, ...]]] = {}
    for chunk, row0 in zip(chunks, row_starts):
        targets = chunk.prompt_targets
        if not targets:
            continue
        k = chunk.sampling.prompt_logprobs or 0
        entries: list[SampledToken] = []
        for lo in range(0, len(targets), PIECE_ROWS):
            hi = min(lo + PIECE_ROWS, len(targets))
            rows = hidden[row0 + lo:row0 + hi]  # [R, H]
            entries.extend(_score(logits_of(rows), targets[lo:hi], k))
        out[chunk.req_id] = (chunk.start_pos + 1, tuple(entries))
    return out


def _score(logits: torch.Tensor, targets: Sequence[int], k: int) -> list[SampledToken]:
    """logits [R, V] (any float dtype), targets [R] -> one entry per row: the target's logprob
    (log-softmax in float32), its rank (1 + the tokens strictly likelier) and the top k."""
    scores = score_tokens(logits.float().log_softmax(dim=-1), targets, k, with_ranks=True)
    return [SampledToken(token_id=t, logprob=lp, top_logprobs=tuple(zip(ids, vals)), rank=r)
            for t, lp, ids, vals, r in zip(targets, scores.logprobs, scores.top_ids,
                                            scores.top_values, scores.ranks)]
