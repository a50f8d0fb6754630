"""Per-request logits edits before sampling: grammar masks, logit_bias, min_tokens, penalties.

Applied in vLLM's order to the rows that ask for them; rows that ask for nothing are untouched
and cost nothing. Penalties follow vLLM (and OpenAI) definitions:

- repetition_penalty r (prompt and output tokens): a seen token's logit l becomes l / r when
  l > 0, l * r otherwise;
- frequency_penalty f, presence_penalty p (output tokens only): l -= f * count + p * (count > 0).

min_tokens masks the request's EOS and stop tokens until that many tokens are out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from cadence.core.plan import ScheduledChunk


def needs_processing(chunk: ScheduledChunk) -> bool:
    p = chunk.sampling
    return (bool(p.logit_bias) or p.needs_history or p.allowed_token_ids is not None
            or bool(p.bad_words_token_ids))


def apply_logits_processors(
    logits: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    masks: Mapping[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """logits [S, V] float32 -> (processed logits [S, V], rows that changed).

    `masks`: row -> bool [V] of allowed tokens (grammars). The input is not modified: the
    caller keeps raw logits for logprobs; the result is a copy when any row changes.
    """
    rows = [i for i, c in enumerate(chunks) if needs_processing(c) or (masks and i in masks)]
    if not rows:
        return logits, []
    out = logits.clone()
    vocab = out.shape[1]
    for i in rows:
        chunk = chunks[i]
        p = chunk.sampling
        row = out[i]  # [V] view
        if masks and i in masks:
            row.masked_fill_(~masks[i], float("-inf"))
        if p.allowed_token_ids is not None:  # vLLM's allowed_token_ids: every other id banned
            allowed = torch.tensor([t for t in p.allowed_token_ids if t < vocab],
                                   dtype=torch.int64, device=row.device)
            keep = row.index_select(0, allowed)
            row.fill_(float("-inf"))
            row.index_copy_(0, allowed, keep)
        if p.bad_words_token_ids:  # vLLM's bad_words (one token each, resolved by the engine)
            banned = [t for t in p.bad_words_token_ids if t < vocab]
            row[torch.tensor(banned, dtype=torch.int64, device=row.device)] = float("-inf")
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias if t < vocab], dtype=torch.int64)
            bias = torch.tensor([b for t, b in p.logit_bias if t < vocab], dtype=row.dtype)
            row.index_add_(0, ids.to(row.device), bias.to(row.device))
        history = chunk.history
        if history is None:
            continue
        num_output = len(history) - chunk.num_prompt_tokens
        if num_output < p.min_tokens:
            stops = [t for t in (*p.stop_token_ids, *(() if p.ignore_eos else p.eos_token_ids))
                     if 0 <= t < vocab]
            if stops:
                row[torch.tensor(stops, device=row.device)] = float("-inf")
        if p.has_penalties:
            _apply_penalties(row, history, chunk.num_prompt_tokens, p)
    return out, rows


def _apply_penalties(row: torch.Tensor, history: Sequence[int], num_prompt: int, p) -> None:
    """row: [V] logits of one request, edited in place."""
    vocab = row.shape[0]
    device = row.device
    if p.repetition_penalty != 1.0 and history:
        seen = torch.tensor(sorted({t for t in history if t < vocab}), dtype=torch.int64,
                            device=device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty,
                                vals * p.repetition_penalty)
    output = [t for t in history[num_prompt:] if t < vocab]
    if output and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0):
        counts = torch.bincount(torch.tensor(output, dtype=torch.int64, device=device),
                                minlength=vocab).to(row.dtype)  # [V]
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
