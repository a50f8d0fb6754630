"""Turn one logits row per sampling chunk into a next token (plus logprobs when asked).

Greedy rows take the argmax of the raw logits. Random rows go through, in vLLM's order:
temperature, min_p, then top_k / top_p, and draw with an exponential race
(argmax(probs / E), E ~ Exp(1)), which picks token i with probability probs[i] exactly. The race
lets each row own its noise: a chunk with `sampling.seed` fills its E from a generator seeded by
(seed, output_index) alone, so its token does not depend on what else shares the batch, on the
batch order, or on preemption (recompute replays the same output_index). Unseeded rows share one
draw from the caller's generator (the engine-level RNG).

All filters are per-row masks over the whole batch at once; the only Python loop is over seeded
rows (one generator each), never over the vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from cadence.core.plan import ScheduledChunk, SampledToken


def seed_for(seed: int, output_index: int) -> int:
    """The generator seed of output token `output_index` of a request seeded with `seed`.

    A hash rather than seed + index, so that (seed, 1) and (seed + 1, 0) do not share noise.
    """
    digest = hashlib.blake2b(
        f"{seed}:{output_index}".encode(), digest_size=8, person=b"cadence"
    ).digest()
    # torch.Generator.manual_seed takes a non-negative int below 2**64.
    return int.from_bytes(digest, "little")


def sample(
    logits: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    generator: torch.Generator | None = None,
) -> list[SampledToken]:
    """Sample one token per row.

    logits: [S, V] (converted to float32), row i belongs to chunks[i].
    generator: the engine-level RNG for unseeded random rows (torch's default RNG when None);
    it must live on logits.device.
    Returns S SampledTokens, in row order.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [num_seqs, vocab], got shape {tuple(logits.shape)}")
    num_rows, vocab = logits.shape
    if num_rows != len(chunks):
        raise ValueError(f"{num_rows} logits rows for {len(chunks)} chunks")
    if num_rows == 0:
        return []
    logits = logits.float()
    params = [c.sampling for c in chunks]

    # token_ids: [S] int64; greedy rows keep their argmax, random rows are overwritten below.
    token_ids = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if random_rows:
        token_ids[random_rows] = _sample_random(
            logits[random_rows], [chunks[i] for i in random_rows], generator
        )

    ids = token_ids.tolist()
    want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not want_logprobs:
        return [SampledToken(token_id=t) for t in ids]
    return _with_logprobs(logits, ids, params, want_logprobs)


def _sample_random(
    logits: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """logits: [R, V] float32 of rows with temperature > 0 -> token ids [R] int64."""
    probs = _filtered_probs(logits, [c.sampling for c in chunks])  # [R, V], rows sum to 1
    noise = torch.empty_like(probs)  # [R, V] ~ Exp(1)
    unseeded = [i for i, c in enumerate(chunks) if c.sampling.seed is None]
    if unseeded:
        draw = torch.empty((len(unseeded), probs.shape[1]), device=probs.device)
        noise[unseeded] = draw.exponential_(generator=generator)
    for i, chunk in enumerate(chunks):
        if chunk.sampling.seed is None:
            continue
        row_gen = torch.Generator(device=probs.device)
        row_gen.manual_seed(seed_for(chunk.sampling.seed, chunk.output_index))
        noise[i].exponential_(generator=row_gen)
    # An exponential draw of exactly 0 would turn a zero-probability token into 0/0.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def _filtered_probs(logits: torch.Tensor, params: Sequence) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p as per-row masks; logits: [R, V] -> probs [R, V]."""
    device = logits.device
    num_rows, vocab = logits.shape
    temperature = torch.tensor([p.temperature for p in params], device=device)  # [R]
    scaled = logits / temperature.unsqueeze(1)

    min_p = torch.tensor([p.min_p for p in params], device=device)  # [R]
    if bool((min_p > 0).any()):
        probs = scaled.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)  # [R, 1]
        # The most likely token always survives (probs == max >= max * min_p).
        scaled = scaled.masked_fill(probs < threshold, float("-inf"))

    # top_k <= 0 (or >= V) means no cap.
    top_k = torch.tensor(
        [p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device
    )  # [R]
    top_p = torch.tensor([p.top_p for p in params], device=device)  # [R]
    needs_k = bool((top_k < vocab).any())
    needs_p = bool((top_p < 1.0).any())
    if needs_k or needs_p:
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)  # [R, V] each
        rank = torch.arange(vocab, device=device).unsqueeze(0)  # [1, V]
        drop = rank >= top_k.unsqueeze(1)  # [R, V] in sorted order
        if needs_p:
            sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            # Mass strictly before each token; a token is kept while that mass is below top_p,
            # so the first token always stays. Rows with top_p == 1 are exempt: cumsum rounding
            # must not cut their tail.
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop |= (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, sorted_idx, sorted_logits)
    return scaled.softmax(dim=-1)


def _with_logprobs(
    logits: torch.Tensor, ids: list[int], params: Sequence, rows: list[int]
) -> list[SampledToken]:
    """Attach OpenAI-style logprobs: log-softmax of the raw (temperature-free) logits."""
    logprobs = logits[rows].log_softmax(dim=-1)  # [L, V]
    chosen = torch.tensor([ids[i] for i in rows], device=logits.device)
    chosen_lp = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()  # [L]
    max_k = max(params[i].logprobs for i in rows)
    top_vals, top_idx = (None, None)
    if max_k > 0:
        top_vals, top_idx = logprobs.topk(max_k, dim=-1)  # [L, max_k] each
        top_vals, top_idx = top_vals.tolist(), top_idx.tolist()

    out = [SampledToken(token_id=t) for t in ids]
    for j, i in enumerate(rows):
        k = params[i].logprobs
        top = ()
        if k > 0:
            top = tuple(zip(top_idx[j][:k], top_vals[j][:k]))
        out[i] = SampledToken(token_id=ids[i], logprob=chosen_lp[j], top_logprobs=top)
    return out
