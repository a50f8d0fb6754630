"""The simulator's executor: a sampled token per chunk, no model, no torch."""

from __future__ import annotations

import zlib

from cadence.core.plan import SampledToken, StepOutput, StepPlan


class HashSampler:
    """Token = crc32(req_id, output index) mod vocab: deterministic across runs and processes
    (unlike hash()), O(1) per chunk. Requests run with ignore_eos, so the token values never
    end a request early; they only have to be valid ids.

    For a KV-checking run use cadence.executor.fake_executor.FakeExecutor instead (same
    `execute(plan) -> StepOutput` contract, slower: it replays each request's history)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 4:
            raise ValueError(f"vocab_size must be >= 4, got {vocab_size}")
        self.vocab_size = vocab_size

    def execute(self, plan: StepPlan) -> StepOutput:
        sampled = {}
        for c in plan.chunks:
            if c.sample:
                key = f"{c.req_id}:{c.output_index}".encode()
                sampled[c.req_id] = SampledToken(3 + zlib.crc32(key) % (self.vocab_size - 3))
        return StepOutput(step_id=plan.step_id, sampled=sampled)
