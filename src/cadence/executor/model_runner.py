"""ModelExecutor: runs StepPlans on the torch model and owns its paged KV cache."""

from __future__ import annotations

import time

import torch

from cadence.core.plan import StepOutput, StepPlan
from cadence.executor.inputs import ModelInputs
from cadence.executor.sampler import sample
from cadence.model.kv_cache import KVCache
from cadence.model.loader import LoadedModel


class ModelExecutor:
    """StepPlan -> tensors -> forward -> logits of the sampling rows -> sampled tokens.

    The cache holds `num_blocks` blocks of `block_size` positions, in the model's dtype and on
    its device. `seed` seeds the RNG used by unseeded random sampling (seeded requests use their
    own generator, see sampler.py).
    """

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int,
                 seed: int | None = None):
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.device = loaded.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = KVCache(loaded.config, num_blocks, block_size, loaded.dtype, self.device)
        self.model.prepare_fast_path()  # pack fast-path weights now, not in the first request
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def _check_plan(self, plan: StepPlan) -> None:
        if plan.block_size != self.block_size:
            raise ValueError(f"plan block_size {plan.block_size} != executor block_size {self.block_size}")
        limit = self.config.max_position_embeddings
        for chunk in plan.chunks:
            if chunk.end_pos > limit:
                raise ValueError(
                    f"request {chunk.req_id!r}: position {chunk.end_pos} exceeds the model's "
                    f"context of {limit}"
                )

    @torch.inference_mode()
    def _forward(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor | None, ModelInputs]:
        """Copy-on-write blocks, run the forward; returns logits [S_sample, V] float32 and, when
        the LM head computed it, their argmax [S_sample] int64."""
        self._check_plan(plan)
        inputs = ModelInputs.from_plan(plan, self.config.vocab_size, self.num_blocks, self.device)
        self.kv_cache.copy_blocks(plan.block_copies)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache)  # [T, H]
        logits, argmax = self.model.compute_logits_and_argmax(hidden[inputs.sample_rows])  # [S_sample, V]
        return logits, argmax, inputs

    def forward_logits(self, plan: StepPlan) -> torch.Tensor:
        """Logits [S_sample, V] float32 for the plan's sampling chunks (writes the KV cache)."""
        if plan.is_empty:
            return torch.empty(0, self.config.vocab_size)
        return self._forward(plan)[0]

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step; one SampledToken per chunk with sample=True, keyed by req_id."""
        if plan.is_empty:
            self.kv_cache.copy_blocks(plan.block_copies)
            return StepOutput(step_id=plan.step_id)
        start = time.perf_counter()
        logits, argmax, inputs = self._forward(plan)
        sampled = (sample(logits, inputs.sample_chunks, self.generator, greedy=argmax)
                   if inputs.sample_chunks else [])
        elapsed = time.perf_counter() - start  # sample() reads ids back to the host: synced
        return StepOutput(
            step_id=plan.step_id,
            sampled={c.req_id: tok for c, tok in zip(inputs.sample_chunks, sampled)},
            forward_time_s=elapsed,
        )
