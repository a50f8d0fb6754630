"""Drive a ModelExecutor like a one-request scheduler would (for model-level tests)."""

from __future__ import annotations

from cadence.core.plan import ScheduledChunk, StepPlan
from cadence.core.sampling_params import SamplingParams
from cadence.executor.model_runner import ModelExecutor

from .paged_helpers import scattered_block_table


def greedy_generate(executor: ModelExecutor, prompt: list[int], max_tokens: int,
                    prefill_chunk: int = 10**9, stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Greedy tokens for `prompt`: chunked prefill, then one decode per step, scattered blocks."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    total = len(prompt) + max_tokens
    table = tuple(scattered_block_table(-(-total // executor.block_size), executor.num_blocks, 1))
    tokens, output, computed, step = list(prompt), [], 0, 0
    while len(output) < max_tokens:
        new = tokens[computed:computed + prefill_chunk]
        end = computed + len(new)
        chunk = ScheduledChunk("r0", tuple(new), computed, table, end == len(tokens), params,
                               len(output), is_prefill=computed < len(prompt))
        out = executor.execute(StepPlan(step, (chunk,), executor.block_size))
        computed, step = end, step + 1
        if chunk.sample:
            token = out.sampled["r0"].token_id
            output.append(token)
            tokens.append(token)
            if token in stop_ids:
                break
    return output
