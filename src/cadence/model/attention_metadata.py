"""AttentionMetadata: where each sequence's new tokens sit in the batch and in the paged cache."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch

from cadence.core.plan import ScheduledChunk
from cadence.model.host_tensor import host_matrix, host_tensor


# Steps of at most this many new tokens build per-row tensors from Python lists, larger ones with
# torch ops (a list costs more than an op past a few dozen rows).
ROW_LISTS_MAX_TOKENS = 64


@dataclass(frozen=True)
class AttentionMetadata:
    """Batch layout for one forward over S sequences with T new tokens in total.

    Sequence i computes positions [start_pos[i], seq_lens[i]); its new tokens are rows
    [query_start_loc[i], query_start_loc[i+1]) of the flattened batch, and it attends over cache
    positions [0, seq_lens[i]) read through block_tables[i].
    """

    query_start_loc: torch.Tensor  # [S+1] int64, cumulative new-token counts
    start_pos: torch.Tensor  # [S] int64, first position computed this step
    seq_lens: torch.Tensor  # [S] int64, start_pos + new tokens = context attended over
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [T] int64, cache slot each new token's K/V is written to
    positions: torch.Tensor  # [T] int64, absolute position of each new token (RoPE)
    block_size: int
    # Host-side copies so per-sequence code never syncs with the device.
    query_start_loc_host: tuple[int, ...]
    start_pos_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]
    num_blocks_host: tuple[int, ...]  # blocks each sequence actually uses
    # Single-token sequences (decodes), attended to together; built once per forward, not per
    # layer.
    decode_seqs: tuple[int, ...]
    decode_rows: torch.Tensor  # [B] int64, batch row of each decode's token
    decode_seq_index: torch.Tensor  # [B] int64, block_tables row of each decode
    decode_ctx_lens: torch.Tensor  # [B] int64, context each decode attends over (= its seq_len)
    prefill_seqs: tuple[int, ...]  # sequences with more than one new token

    @cached_property
    def decode_blocks(self) -> torch.Tensor:
        """[B, max_decode_blocks] int64 block ids of the decodes, padded with 0 (gather path only;
        computed on first use so the gather-free path never pays for it)."""
        if not self.decode_seqs:
            return torch.zeros((0, 0), dtype=torch.int64, device=self.block_tables.device)
        max_blocks = max(self.num_blocks_host[i] for i in self.decode_seqs)
        return self.block_tables[self.decode_seq_index, :max_blocks].to(torch.int64)

    @cached_property
    def decode_valid(self) -> torch.Tensor:
        """[B, max_decode_blocks * block_size] bool, position < seq_len (masks the padding)."""
        width = self.decode_blocks.shape[1] * self.block_size
        positions = torch.arange(width, device=self.block_tables.device)
        return positions[None, :] < self.decode_ctx_lens[:, None]

    @cached_property
    def row_seq_index(self) -> torch.Tensor:
        """[T] int64 (CPU), block_tables row (sequence) of every new token (the fused decode
        stack)."""
        bounds = self.query_start_loc_host
        return host_tensor(i for i in range(len(bounds) - 1) for _ in range(bounds[i + 1] - bounds[i]))

    @cached_property
    def row_ctx_lens(self) -> torch.Tensor:
        """[T] int64 (CPU), positions each new token attends over: its own position + 1 (causal).
        From the host copies at the fused stack's sizes (a decode step's, every step: no torch
        op), from the positions tensor above them."""
        if self.num_tokens > ROW_LISTS_MAX_TOKENS:
            return self.positions.cpu() + 1
        return host_tensor(itertools.chain.from_iterable(
            range(s + 1, e + 1) for s, e in zip(self.start_pos_host, self.seq_lens_host)))

    @property
    def max_new_tokens(self) -> int:
        """The longest chunk of new tokens of any sequence in this step."""
        return max(b - a for a, b in zip(self.query_start_loc_host, self.query_start_loc_host[1:]))

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc_host[-1]

    @classmethod
    def build(cls, chunks: Sequence[tuple[int, int, Sequence[int]]], block_size: int,
              num_blocks: int, device: torch.device | str = "cpu") -> "AttentionMetadata":
        """From (start_pos, num_new_tokens, block_table) per sequence; validates the tables."""
        if not chunks:
            raise ValueError("AttentionMetadata needs at least one sequence")
        # Host lists first, one tensor each at the end: at decode batch sizes a torch op costs
        # more than a Python loop over the batch (this runs every step).
        starts, lens, tables, positions, slots = [], [], [], [], []
        for i, (start, n_new, table) in enumerate(chunks):
            if start < 0 or n_new <= 0:
                raise ValueError(f"sequence {i}: need start_pos >= 0 and new tokens > 0, got {start}, {n_new}")
            needed = -(-(start + n_new) // block_size)
            if len(table) < needed:
                raise ValueError(
                    f"sequence {i}: block table has {len(table)} blocks, positions up to "
                    f"{start + n_new} need {needed} (block_size {block_size})"
                )
            table = tuple(table[:needed])
            if min(table) < 0 or max(table) >= num_blocks:
                raise ValueError(f"sequence {i}: block ids {table} outside pool of {num_blocks}")
            starts.append(start)
            lens.append(n_new)
            tables.append(table)
            span = range(start, start + n_new)
            positions.extend(span)
            slots.extend([table[p // block_size] * block_size + p % block_size for p in span])
        query_start_loc = [0]
        for n in lens:
            query_start_loc.append(query_start_loc[-1] + n)
        seq_lens = [s + n for s, n in zip(starts, lens)]
        max_blocks = max(len(t) for t in tables)
        padded = [t + (0,) * (max_blocks - len(t)) for t in tables]
        decode_seqs = tuple(i for i, n in enumerate(lens) if n == 1)

        def tensor(values) -> torch.Tensor:
            return host_tensor(values, torch.int64, device)

        return cls(
            query_start_loc=tensor(query_start_loc),
            start_pos=tensor(starts),
            seq_lens=tensor(seq_lens),
            block_tables=host_matrix(padded, max_blocks, torch.int32, device),
            slot_mapping=tensor(slots),
            positions=tensor(positions),
            block_size=block_size,
            query_start_loc_host=tuple(query_start_loc),
            start_pos_host=tuple(starts),
            seq_lens_host=tuple(seq_lens),
            num_blocks_host=tuple(len(t) for t in tables),
            decode_seqs=decode_seqs,
            decode_rows=tensor([query_start_loc[i] for i in decode_seqs]),
            decode_seq_index=tensor(decode_seqs),
            decode_ctx_lens=tensor([seq_lens[i] for i in decode_seqs]),
            prefill_seqs=tuple(i for i, n in enumerate(lens) if n > 1),
        )

    @classmethod
    def from_chunks(cls, chunks: Sequence[ScheduledChunk], block_size: int, num_blocks: int,
                    device: torch.device | str = "cpu") -> "AttentionMetadata":
        """From a StepPlan's chunks, in batch order."""
        return cls.build([(c.start_pos, c.num_new_tokens, c.block_table) for c in chunks],
                         block_size, num_blocks, device)
