"""Turn one logits row per sampling chunk into a next token (plus logprobs when asked).

Greedy rows take the argmax of the raw logits. Random rows go through, in vLLM's order:
temperature, min_p, then top_k / top_p, and draw with the Gumbel-max trick
(argmax(logits + Gumbel noise)), which picks token i with probability softmax(logits)[i]
exactly. Per-element noise lets each row own its randomness: a chunk with `sampling.seed`
draws its noise from a generator seeded by (seed, output_index) alone, so its token does not depend on what else shares the batch, on the
batch order, or on preemption (recompute replays the same output_index). Unseeded rows share one
draw from the caller's generator (the engine-level RNG).

All filters are per-row masks over the whole batch at once; the only Python loop is over seeded
rows (one generator each), never over the vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, MutableMapping, Sequence

import torch

from cadence.core.plan import ScheduledChunk, SampledToken
from cadence.executor.logits_processors import TokenEdits, apply_logits_processors
from cadence.executor.token_logprobs import score_tokens
from cadence.model.kernels.cpu_ops import cpu_kernels_for


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
    greedy: torch.Tensor | None = None,
    masks: Mapping[int, torch.Tensor] | None = None,
    edits: MutableMapping[str, TokenEdits] | None = None,
) -> list[SampledToken]:
    """Sample one token per row.

    logits: [S, V] (converted to float32), row i belongs to chunks[i].
    generator: the engine-level RNG for unseeded random rows (torch's default RNG when None);
    it must live on logits.device.
    greedy: logits.argmax(-1) when the caller already has it ([S] int64, e.g. from the LM
    head's kernel); computed here otherwise.
    masks: row -> bool [V] allowed tokens (structured output grammars).
    edits: req_id -> TokenEdits, the requests' token-id edits built at admission (filled in
    here for requests that were not prepared).
    Returns S SampledTokens, in row order. Logprobs are of the raw logits (vLLM's default),
    the token is drawn from the processed ones (logits_processors.py).
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
    if greedy is not None and tuple(greedy.shape) != (num_rows,):
        raise ValueError(f"greedy ids must be [{num_rows}], got shape {tuple(greedy.shape)}")
    raw = logits
    logits, changed = apply_logits_processors(raw, chunks, masks, edits)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    token_ids = greedy_ids(logits) if greedy is None else greedy
    if greedy is not None and (changed or random_rows):
        token_ids = greedy.clone()  # rows below are overwritten; the caller's stays as it was
    if changed and greedy is not None:
        token_ids[changed] = logits[changed].argmax(dim=-1)
    if random_rows:
        token_ids[random_rows] = _sample_random(
            logits[random_rows], [chunks[i] for i in random_rows], generator
        )

    ids = token_ids.tolist()
    want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not want_logprobs:
        return [SampledToken(token_id=t) for t in ids]
    return _with_logprobs(raw, ids, params, want_logprobs)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(-1) ([S, V] float32 -> [S] int64), through the CPU kernel when it loaded."""
    kernels = cpu_kernels_for(logits)
    if kernels is not None and logits.dtype == torch.float32:
        return kernels.argmax_rows(logits.contiguous())
    return logits.argmax(dim=-1)


def _sample_random(
    logits: torch.Tensor,
    chunks: Sequence[ScheduledChunk],
    generator: torch.Generator | None,
) -> torch.Tensor:
    """logits: [R, V] float32 of rows with temperature > 0 -> token ids [R] int64."""
    masked = _filtered_logits(logits, [c.sampling for c in chunks])  # [R, V], -inf = dropped
    # Gumbel-max: argmax(logits + G), G = -log(E), E = -log(U) ~ Exp(1), picks token i with
    # probability softmax(logits)[i] exactly, without normalizing. U from uniform_ (several
    # times faster than exponential_ on CPU); U == 0 gives G = -inf, the token just loses.
    noise = torch.empty_like(masked)  # [R, V] ~ U[0, 1)
    unseeded = [i for i, c in enumerate(chunks) if c.sampling.seed is None]
    if len(unseeded) == len(chunks):
        noise.uniform_(generator=generator)
    elif unseeded:
        draw = torch.empty((len(unseeded), masked.shape[1]), device=masked.device)
        noise[unseeded] = draw.uniform_(generator=generator)
    for i, chunk in enumerate(chunks):
        if chunk.sampling.seed is None:
            continue
        row_gen = torch.Generator(device=masked.device)
        row_gen.manual_seed(seed_for(chunk.sampling.seed, chunk.output_index))
        noise[i].uniform_(generator=row_gen)
    gumbel = noise.log_().neg_().log_().neg_()
    return (masked + gumbel).argmax(dim=-1)


def _filtered_logits(logits: torch.Tensor, params: Sequence) -> torch.Tensor:
    """Temperature, then min_p, top_k, top_p as per-row cutoffs: [R, V] -> [R, V] logits with
    dropped tokens at -inf. Each filter touches only the rows that use it."""
    device = logits.device
    vocab = logits.shape[1]
    temperature = torch.tensor([p.temperature for p in params], device=device)  # [R]
    scaled = logits / temperature.unsqueeze(1)

    min_p_rows = [i for i, p in enumerate(params) if p.min_p > 0]
    if min_p_rows:
        rows = scaled[min_p_rows]
        probs = rows.softmax(dim=-1)
        min_p = torch.tensor([params[i].min_p for i in min_p_rows], device=device)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)  # [M, 1]
        # The most likely token always survives (its prob == max >= max * min_p).
        scaled[min_p_rows] = rows.masked_fill(probs < threshold, float("-inf"))

    def top_k_of(p) -> int:
        return p.top_k if 0 < p.top_k < vocab else vocab  # <= 0 or >= V: no cap

    top_p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    top_k_rows = [i for i, p in enumerate(params) if top_k_of(p) < vocab and p.top_p >= 1.0]
    if top_k_rows:
        # k-th largest value per row; a full sort is not needed for top_k alone.
        rows = scaled[top_k_rows]
        ks = torch.tensor([top_k_of(params[i]) for i in top_k_rows], device=device)  # [K]
        top_vals = rows.topk(int(ks.max()), dim=-1).values  # [K, max_k], descending
        kth = top_vals.gather(1, (ks - 1).unsqueeze(1))  # [K, 1]
        scaled[top_k_rows] = rows.masked_fill(rows < kth, float("-inf"))
    if top_p_rows:
        rows = scaled[top_p_rows]
        ks = torch.tensor([top_k_of(params[i]) for i in top_p_rows], device=device)
        top_p = torch.tensor([params[i].top_p for i in top_p_rows], device=device)
        max_k = int(ks.max())
        if max_k <= vocab // 8:
            # Every row also caps k: only the top max_k values matter, topk beats a full sort.
            sorted_vals = rows.topk(max_k, dim=-1).values  # [P, max_k], descending
        else:
            sorted_vals = rows.sort(dim=-1, descending=True).values  # [P, V]
        rank = torch.arange(sorted_vals.shape[1], device=device).unsqueeze(0)  # [1, V or max_k]
        in_k = rank < ks.unsqueeze(1)
        # top_k first, then top_p on the renormalized rest (vLLM's order).
        probs = sorted_vals.masked_fill(~in_k, float("-inf")).softmax(dim=-1)
        # Mass strictly before each token: kept while below top_p, so the first always stays.
        # Both conditions keep a prefix of the sorted order, so a count says where to cut.
        mass_before = probs.cumsum(dim=-1) - probs
        num_keep = (in_k & (mass_before < top_p.unsqueeze(1))).sum(dim=-1).clamp_min(1)  # [P]
        cutoff = sorted_vals.gather(1, (num_keep - 1).unsqueeze(1))  # [P, 1]
        # Tokens tied with the cutoff value all stay (the sort order among ties is arbitrary).
        scaled[top_p_rows] = rows.masked_fill(rows < cutoff, float("-inf"))
    return scaled


def _with_logprobs(
    logits: torch.Tensor, ids: list[int], params: Sequence, rows: list[int]
) -> list[SampledToken]:
    """Attach OpenAI-style logprobs: log-softmax of the raw (temperature-free) logits."""
    logprobs = logits[rows].log_softmax(dim=-1)  # [L, V]
    scores = score_tokens(logprobs, [ids[i] for i in rows], max(params[i].logprobs for i in rows))
    out = [SampledToken(token_id=t) for t in ids]
    for j, i in enumerate(rows):
        k = params[i].logprobs  # the row's own k <= the batch's largest
        top = tuple(zip(scores.top_ids[j][:k], scores.top_values[j][:k]))
        out[i] = SampledToken(token_id=ids[i], logprob=scores.logprobs[j], top_logprobs=top)
    return out
