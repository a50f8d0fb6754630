"""The plain objects that cross the decision/compute boundary.

The scheduler emits a StepPlan (ints and tuples only, no live Request), the executor returns a
StepOutput. Like vLLM v1's SchedulerOutput: the executor never sees scheduler state, so the same
plan can run on the torch model, a fake executor or the simulator's cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cadence.core.sampling_params import SamplingParams


# Built for every request on every step: slots and no frozen=True, whose per-field
# object.__setattr__ makes construction ~6x slower (about 1.4 us per record, 0.3 ms a step at 64
# sequences). Read-only by convention: nothing mutates one after it is built.
@dataclass(slots=True)
class ScheduledChunk:
    """One request's share of a step: compute positions [start_pos, start_pos + len(token_ids)).

    A decode is a chunk of one token; a prefill chunk is many. `block_table` lists the physical
    KV blocks that hold positions [0, start_pos + len(token_ids)) in order, block i holding
    positions [i * block_size, (i + 1) * block_size). `sample` is True when this chunk reaches the
    end of the request's known tokens, so a next token must be sampled from its last position.
    `output_index` is the number of tokens the request has generated so far (the index of the
    token this step would sample), which seeded sampling uses.
    """

    req_id: str
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    sample: bool
    sampling: SamplingParams
    output_index: int
    is_prefill: bool = True
    # prompt + output tokens so far, only when the sampler needs them (penalties, min_tokens,
    # grammars; `sampling.needs_history`): a live read-only view, valid for this step.
    history: Sequence[int] | None = None
    num_prompt_tokens: int = 0
    # Prompt logprobs (sampling.prompt_logprobs set): the prompt tokens this chunk's rows
    # predict, row i predicting prompt token start_pos + i + 1 (the last row of a non-final
    # chunk predicts the next chunk's first token); empty for every other chunk.
    prompt_targets: tuple[int, ...] = ()

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class StepPlan:
    """Everything one engine step computes, in batch order."""

    step_id: int
    chunks: tuple[ScheduledChunk, ...]
    block_size: int
    # Requests preempted (blocks freed, to be recomputed later) while building this plan.
    preempted: tuple[str, ...] = ()
    # Blocks whose contents must be copied before the forward (src, dst): copy-on-write. Unused
    # unless a policy shares a partially filled block.
    block_copies: tuple[tuple[int, int], ...] = ()
    # Swap preemption (core/swap.py), done by the executor before the forward, out first:
    # (device block, host block) pairs to copy to the host tier, (host block, device block)
    # pairs to copy back.
    swap_out: tuple[tuple[int, int], ...] = ()
    swap_in: tuple[tuple[int, int], ...] = ()
    # The disk tier (core/disk_tier.py): (device block, disk slot) pairs written before
    # anything else (swap-outs and spilled prefix blocks), (disk slot, device block) pairs read
    # after every write (swap-ins and prefix reloads), and slots whose files are deleted after
    # the reads.
    disk_out: tuple[tuple[int, int], ...] = ()
    disk_in: tuple[tuple[int, int], ...] = ()
    disk_discard: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks if c.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks if not c.is_prefill)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(slots=True)  # per request per step, like ScheduledChunk
class SampledToken:
    token_id: int
    # log-probability of the sampled token and the top-k alternatives, when asked for.
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    # Its rank in the whole distribution (1 = the likeliest), where computed (prompt logprobs).
    rank: int | None = None


@dataclass(frozen=True)
class StepOutput:
    """What the executor returns: one sampled token per chunk whose `sample` flag was set."""

    step_id: int
    sampled: dict[str, SampledToken] = field(default_factory=dict)
    # Wall time of the forward pass, seconds (telemetry; the fake executor may report 0).
    forward_time_s: float = 0.0
    # Disk tier I/O that failed (disk full, unreadable file): the slots, and the requests whose
    # chunks were left out of the forward because their KV could not be read (the scheduler
    # recomputes them); `io_error` says why, for the log.
    failed_disk_slots: tuple[int, ...] = ()
    skipped_req_ids: tuple[str, ...] = ()
    io_error: str = ""
    # Prompt logprobs of the chunks with prompt_targets: req_id -> (index of the first prompt
    # token covered, one entry per target: its logprob, rank and top alternatives).
    prompt_logprobs: dict[str, tuple[int, tuple[SampledToken, ...]]] = field(default_factory=dict)
