"""Swap preemption: a preempted request's full KV blocks go to a host tier and come back, so it
resumes instead of recomputing; outputs stay those of an uncontended run."""

from __future__ import annotations

import pytest
from core_driver import VOCAB, RequestSpec, run

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.scheduler import Scheduler
from cadence.executor.fake_executor import FakeExecutor

SPECS = [RequestSpec(f"r{i}", list(range(3 + i, 40 + i)), 24, arrival_step=i) for i in range(5)]


def scheduler(policy: str, num_blocks: int, swap_blocks: int, scheduling: str = "fcfs"):
    return Scheduler(
        SchedulerConfig(policy=policy, max_num_batched_tokens=48, max_num_seqs=8,
                        scheduling=scheduling),
        CacheConfig(block_size=4, num_blocks=num_blocks, num_swap_blocks=swap_blocks),
    )


@pytest.mark.parametrize("policy", ["eager", "chunked", "slo"])
def test_swapped_requests_resume_with_unchanged_outputs(policy):
    roomy = run(scheduler(policy, 4096, 0), FakeExecutor(VOCAB), SPECS)
    recompute = run(scheduler(policy, 36, 0), FakeExecutor(VOCAB), SPECS)
    swapped = run(scheduler(policy, 36, 64), FakeExecutor(VOCAB), SPECS)
    assert swapped.outputs == recompute.outputs == roomy.outputs
    stats = swapped.stats
    assert stats.num_swap_preemptions_total > 0
    assert stats.num_blocks_swapped_out_total >= stats.num_blocks_swapped_in_total > 0
    # Resuming computes fewer positions than recomputing from scratch.
    assert len(swapped.computed) <= len(recompute.computed)
    assert sum(e - s for _, s, e in swapped.computed) < sum(e - s for _, s, e in recompute.computed)


def test_a_full_host_tier_falls_back_to_recompute():
    full = run(scheduler("chunked", 36, 1), FakeExecutor(VOCAB), SPECS)
    roomy = run(scheduler("chunked", 4096, 0), FakeExecutor(VOCAB), SPECS)
    assert full.outputs == roomy.outputs
    assert full.stats.num_preemptions_total > full.stats.num_swap_preemptions_total


def test_swap_with_priority_preemption_and_aborts():
    specs = [RequestSpec(f"bg{i}", list(range(4 + i, 30 + i)), 30, priority=9) for i in range(3)]
    specs += [RequestSpec(f"urgent{i}", [7 + i] * 9, 6, arrival_step=3 + 5 * i, priority=0)
              for i in range(3)]
    specs.append(RequestSpec("gone", list(range(50, 70)), 30, priority=9, abort_step=12))
    swapped = run(scheduler("chunked", 24, 64, scheduling="priority"), FakeExecutor(VOCAB), specs)
    roomy = run(scheduler("chunked", 4096, 0), FakeExecutor(VOCAB), specs)
    for rid, tokens in swapped.outputs.items():
        if rid != "gone":
            assert tokens == roomy.outputs[rid]
    assert swapped.stats.num_swap_preemptions_total > 0
