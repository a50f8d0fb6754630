"""ModelInputs: the tensors one StepPlan turns into (flat token ids, attention layout, sample rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.model.attention_metadata import AttentionMetadata
from cadence.model.host_tensor import host_tensor


@dataclass(frozen=True)
class ModelInputs:
    """Flattened batch for one forward."""

    input_ids: torch.Tensor  # [T] int64, every chunk's new tokens in batch order
    meta: AttentionMetadata  # positions, slots, block tables
    sample_rows: torch.Tensor  # [S_sample] int64, row of the last token of each sampling chunk
    sample_chunks: tuple[ScheduledChunk, ...]  # the chunks those rows belong to, same order

    @property
    def positions(self) -> torch.Tensor:
        return self.meta.positions

    @classmethod
    def from_plan(cls, plan: StepPlan, vocab_size: int, num_blocks: int,
                  device: torch.device) -> "ModelInputs":
        """Validate the plan against the model and the cache, then build the tensors."""
        if plan.is_empty:
            raise ValueError("cannot build model inputs for an empty plan")
        req_ids = [c.req_id for c in plan.chunks]
        if len(set(req_ids)) != len(req_ids):
            dup = next(r for r in req_ids if req_ids.count(r) > 1)
            raise ValueError(f"request {dup!r} appears twice in step plan {plan.step_id}")
        flat_ids: list[int] = []
        for chunk in plan.chunks:
            if not chunk.token_ids:
                raise ValueError(f"request {chunk.req_id!r}: chunk has no tokens")
            flat_ids.extend(chunk.token_ids)
        if min(flat_ids) < 0 or max(flat_ids) >= vocab_size:
            bad = next(t for t in flat_ids if not 0 <= t < vocab_size)
            raise ValueError(f"token id {bad} outside the model's vocabulary [0, {vocab_size})")
        try:
            meta = AttentionMetadata.from_chunks(plan.chunks, plan.block_size, num_blocks, device)
        except ValueError as exc:
            raise ValueError(f"invalid step plan {plan.step_id}: {exc}") from exc
        ends = meta.query_start_loc_host[1:]
        sample_idx = [i for i, c in enumerate(plan.chunks) if c.sample]
        return cls(
            input_ids=host_tensor(flat_ids, torch.int64, device),
            meta=meta,
            sample_rows=host_tensor([ends[i] - 1 for i in sample_idx], torch.int64, device),
            sample_chunks=tuple(plan.chunks[i] for i in sample_idx),
        )
