"""Per-request logits edits before sampling: grammar masks, logit_bias, min_tokens, penalties.

Applied in vLLM's order to the rows that ask for them; rows that ask for nothing are untouched
and cost nothing. Penalties follow vLLM (and OpenAI) definitions:

- repetition_penalty r (prompt and output tokens): a seen token's logit l becomes l / r when
  l > 0, l * r otherwise;
- frequency_penalty f, presence_penalty p (output tokens only): l -= f * count + p * (count > 0).

min_tokens masks the request's EOS and stop tokens until that many tokens are out. bad_words
of one token are banned always, longer ones' last token after the rest (vLLM's rule).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import torch

from cadence.core.plan import ScheduledChunk
from cadence.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenEdits:
    """A request's token-id edits as tensors (allowed_token_ids, bad words, logit_bias),
    built once, at admission, instead of from Python tuples on every step: the setup grows
    with the lists, a step then pays only the indexing."""

    allowed: torch.Tensor | None  # int64 [A] ids kept (vLLM's allowed_token_ids)
    banned: torch.Tensor | None  # int64 [B] ids banned (bad_words, one token each)
    bias_ids: torch.Tensor | None  # int64 [L]
    bias: torch.Tensor | None  # float32 [L], added to bias_ids' logits


def has_token_edits(p: SamplingParams) -> bool:
    return bool(p.logit_bias) or p.allowed_token_ids is not None or bool(p.bad_words_token_ids)


def token_edits(p: SamplingParams, vocab: int) -> TokenEdits:
    """The tensors of a request's token-id edits (ids past `vocab` dropped)."""
    def ids(values) -> torch.Tensor:
        return torch.tensor([t for t in values if t < vocab], dtype=torch.int64)

    bias = [(t, b) for t, b in p.logit_bias if t < vocab]
    return TokenEdits(
        allowed=ids(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
        banned=ids(p.bad_words_token_ids) if p.bad_words_token_ids else None,
        bias_ids=torch.tensor([t for t, _ in bias], dtype=torch.int64) if bias else None,
        bias=torch.tensor([b for _, b in bias], dtype=torch.float32) if bias else None)


def needs_processing(chunk: ScheduledChunk) -> bool:
    p = chunk.sampling
    return p.needs_history or has_token_edits(p)


def apply_logits_processors(
    logits: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    masks: Mapping[int, torch.Tensor] | None = None,
    edits: MutableMapping[str, TokenEdits] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """logits [S, V] float32 -> (processed logits [S, V], rows that changed).

    `masks`: row -> bool [V] of allowed tokens (grammars). `edits`: req_id -> its TokenEdits
    (built at admission); a request missing there gets them built now and kept there. The
    input is not modified: the caller keeps raw logits for logprobs; the result is a copy
    when any row changes.
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
        if has_token_edits(p):
            e = edits.get(chunk.req_id) if edits is not None else None
            if e is None:
                e = token_edits(p, vocab)
                if edits is not None:
                    edits[chunk.req_id] = e
            if e.allowed is not None:  # vLLM's allowed_token_ids: every other id banned
                allowed = e.allowed.to(row.device)
                keep = row.index_select(0, allowed)
                row.fill_(float("-inf"))
                row.index_copy_(0, allowed, keep)
            if e.banned is not None:  # vLLM's bad_words (one token each, resolved at admission)
                row[e.banned.to(row.device)] = float("-inf")
            if e.bias_ids is not None:
                row.index_add_(0, e.bias_ids.to(row.device), e.bias.to(row.device, row.dtype))
        history = chunk.history
        if history is None:
            continue
        num_output = len(history) - chunk.num_prompt_tokens
        if num_output < p.min_tokens:
            stops = [t for t in (*p.stop_token_ids, *(() if p.ignore_eos else p.eos_token_ids))
                     if 0 <= t < vocab]
            if stops:
                row[torch.tensor(stops, device=row.device)] = float("-inf")
        if p.bad_words_sequences:
            _ban_word_endings(row, history, chunk.num_prompt_tokens, p.bad_words_sequences)
        if p.has_penalties:
            _apply_penalties(row, history, chunk.num_prompt_tokens, p)
    return out, rows


def _ban_word_endings(row: torch.Tensor, history: Sequence[int], num_prompt: int,
                      words: Sequence[Sequence[int]]) -> None:
    """vLLM's bad words of several tokens: a word's last token is banned where the output so
    far (history past the prompt) ends with the rest of the word. row: [V] logits, edited in
    place; only each word's length of the history is read."""
    num_output = len(history) - num_prompt
    for word in words:
        prefix = len(word) - 1
        if num_output < prefix or word[-1] >= row.shape[0]:
            continue
        if list(history[len(history) - prefix:]) == list(word[:-1]):
            row[word[-1]] = float("-inf")


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
