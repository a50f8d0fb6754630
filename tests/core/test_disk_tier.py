"""The disk tier: swap preemption to disk when the host tier is full or absent, prefix-cache
spill and reload, and disk faults that fall back to recompute; outputs stay those of an
uncontended run (the fake executor's tokens depend on every KV position it reads)."""

from __future__ import annotations

import pytest
from core_driver import VOCAB, RequestSpec, make_scheduler, reference_outputs, run
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cadence.core.disk_tier import DiskTier
from cadence.executor.fake_executor import FakeExecutor

SPECS = [RequestSpec(f"r{i}", list(range(3 + i, 40 + i)), 24, arrival_step=i) for i in range(5)]


def tight(policy="chunked", swap=0, disk=64, spill=True, num_blocks=36, prefix=True, **kw):
    return make_scheduler(policy=policy, budget=48, max_seqs=8, block_size=4,
                          num_blocks=num_blocks, swap_blocks=swap, disk_blocks=disk,
                          prefix_spill=spill, prefix_caching=prefix, **kw)


def roomy_outputs(specs):
    return run(make_scheduler(budget=4096, max_seqs=64, num_blocks=4096, block_size=4),
               FakeExecutor(VOCAB), specs).outputs


@pytest.mark.parametrize("policy", ["eager", "chunked", "slo"])
def test_disk_swapped_requests_resume_with_unchanged_outputs(policy):
    recompute = run(tight(policy, disk=0), FakeExecutor(VOCAB), SPECS)
    executor = FakeExecutor(VOCAB)
    scheduler = tight(policy, spill=False)
    swapped = run(scheduler, executor, SPECS)
    assert swapped.outputs == recompute.outputs == roomy_outputs(SPECS)
    stats = swapped.stats
    assert stats.num_disk_swap_preemptions_total == stats.num_swap_preemptions_total > 0
    assert stats.num_blocks_disk_swapped_out_total >= stats.num_blocks_disk_swapped_in_total > 0
    assert stats.num_blocks_swapped_out_total == 0  # no host tier
    # Resuming computes fewer positions than recomputing from scratch.
    assert sum(e - s for _, s, e in swapped.computed) < sum(
        e - s for _, s, e in recompute.computed)
    # Every slot came back and every file is deleted by the next plan.
    assert stats.num_disk_blocks_used == 0
    executor.execute(scheduler.schedule())
    assert executor.num_disk_files == 0


def test_a_full_host_tier_falls_back_to_disk():
    scheduler = tight(swap=12, num_blocks=24)  # room for one preempted request at a time
    scheduler.swap_block_copy_s = 1e-5  # host copies are cheaper than disk I/O
    both = run(scheduler, FakeExecutor(VOCAB), SPECS)
    assert both.outputs == roomy_outputs(SPECS)
    s = both.stats
    assert s.num_blocks_swapped_out_total > 0 and s.num_blocks_disk_swapped_out_total > 0
    assert s.num_swap_preemptions_total > s.num_disk_swap_preemptions_total > 0


def test_the_cost_choice_recomputes_when_the_disk_is_slow():
    scheduler = tight(spill=False)
    scheduler.disk_block_write_s = scheduler.disk_block_read_s = 1.0  # 2 s a block
    result = run(scheduler, FakeExecutor(VOCAB), SPECS)
    assert result.num_preemptions > 0
    assert result.stats.num_swap_preemptions_total == 0
    assert result.outputs == roomy_outputs(SPECS)


def prefix_specs(block_size=4):
    """A long shared prefix, then unrelated requests that evict it, then the prefix again."""
    shared = list(range(5, 5 + 6 * block_size))
    specs = [RequestSpec("first", shared + [1, 2, 3], 4, arrival_step=0)]
    specs += [RequestSpec(f"evict{i}", list(range(10 + 7 * i, 40 + 7 * i)), 4, arrival_step=3 + i)
              for i in range(4)]
    specs.append(RequestSpec("again", shared + [7, 8], 6, arrival_step=40))
    return shared, specs


def test_spilled_prefix_blocks_are_reloaded_with_the_same_tokens():
    shared, specs = prefix_specs()
    executor = FakeExecutor(VOCAB)
    result = run(tight(num_blocks=12, disk=64), executor, specs)
    stats = result.stats
    assert stats.num_prefix_blocks_spilled_total > 0
    assert stats.num_prefix_blocks_reloaded_total == 6  # the whole shared prefix
    for s in specs:
        assert result.outputs[s.req_id] == reference_outputs(executor, s)
    # "again" computed only what follows the reloaded prefix: its first chunk starts there.
    first = next(start for rid, start, _ in result.computed if rid == "again")
    assert first == len(shared)
    # Without the disk tier the prefix is recomputed.
    plain = run(tight(num_blocks=12, disk=0), FakeExecutor(VOCAB), specs)
    assert next(start for rid, start, _ in plain.computed if rid == "again") == 0
    assert plain.outputs == result.outputs


def test_the_disk_budget_keeps_the_most_recent_spilled_blocks():
    tier = DiskTier(3)
    slots = [tier.spill(bytes([i])) for i in range(3)]
    tier.end_step()
    assert sorted(slots) == [0, 1, 2] and tier.num_free_blocks == 0
    tier.reload(bytes([0]))  # most recently used now; pinned in this step
    tier.end_step()
    tier.spill(bytes([3]))  # evicts the least recently used: block 1
    tier.end_step()
    assert tier.lookup(bytes([1])) is None
    assert all(tier.lookup(bytes([i])) is not None for i in (0, 2, 3))
    # A swap-out takes precedence: spilled blocks make room, oldest first.
    assert tier.has_room(3) and not tier.has_room(4)
    tier.take("req", 2)
    assert tier.lookup(bytes([3])) is not None and tier.num_spilled_blocks == 1
    assert tier.num_spilled_dropped == 3
    tier.check_integrity()


def test_a_block_reloaded_in_a_step_is_not_reused_in_that_step():
    tier = DiskTier(1)
    slot = tier.spill(b"a")
    tier.end_step()
    assert tier.reload(b"a") == slot
    assert not tier.has_room(1)  # pinned: a swap-out in this step must not overwrite it
    assert tier.spill(b"b") is None
    tier.end_step()
    assert tier.has_room(1)


@pytest.mark.parametrize("fail", ["write", "read"])
def test_disk_faults_fall_back_to_recompute(fail):
    executor = FakeExecutor(VOCAB)
    executor.disk_fault = lambda op, slot: op == fail
    scheduler = tight()
    result = run(scheduler, executor, SPECS)
    assert result.outputs == roomy_outputs(SPECS)
    assert result.stats.num_kv_offload_failures_total > 0
    # No slot leaks: only spilled prefix blocks stay on disk once every request finished.
    assert result.stats.num_disk_blocks_used == scheduler.disk.num_spilled_blocks


def test_failed_prefix_reload_recomputes_the_prefix():
    shared, specs = prefix_specs()
    executor = FakeExecutor(VOCAB)
    executor.disk_fault = lambda op, slot: op == "read"
    result = run(tight(num_blocks=12, disk=64), executor, specs)
    assert result.stats.num_kv_offload_failures_total > 0
    for s in specs:
        assert result.outputs[s.req_id] == reference_outputs(executor, s)
    again = [start for rid, start, _ in result.computed if rid == "again"]
    assert again[0] == 0  # the skipped chunk is not computed; it restarted from scratch


def test_aborted_swapped_requests_leave_no_files():
    # r3 is swapped to disk from step 12 to 21 in this workload: abort it there.
    specs = [RequestSpec(s.req_id, s.prompt, s.max_tokens, s.arrival_step,
                         abort_step=15 if s.req_id == "r3" else None) for s in SPECS]
    executor = FakeExecutor(VOCAB)
    scheduler = tight(spill=False)
    result = run(scheduler, executor, specs)
    assert result.finish_reasons["r3"] == "abort"
    stats = result.stats
    assert stats.num_disk_swap_preemptions_total > 0
    # r3's blocks never came back.
    assert stats.num_blocks_disk_swapped_out_total > stats.num_blocks_disk_swapped_in_total
    assert stats.num_disk_blocks_used == 0
    executor.execute(scheduler.schedule())  # the next plan carries the deletions
    assert executor.num_disk_files == 0


@pytest.mark.parametrize("disk,swap", [(64, 0), (0, 64)])
def test_a_failed_step_voids_its_swap_outs(disk, swap):
    """The executor raised on a step that swapped requests out (its copies may not have been
    made): those requests are recomputed, the others' tokens are unchanged."""
    executor = FakeExecutor(VOCAB)
    scheduler = tight(disk=disk, swap=swap)
    for s in SPECS:
        scheduler.add_request(s.build())
    outputs = {s.req_id: [] for s in SPECS}
    failed = 0
    for _ in range(2000):
        if not scheduler.has_unfinished():
            break
        plan = scheduler.schedule()
        if (plan.swap_out or plan.disk_out) and plan.preempted and not failed:
            failed += 1
            victims = [r for r in plan.preempted if r not in {c.req_id for c in plan.chunks}]
            scheduler.discard_plan_copies(plan)  # as LLMEngine._fail_plan: chunks' requests fail
            for c in plan.chunks:
                scheduler.abort_request(c.req_id, reason="error")
            plan = scheduler.schedule()
        out = executor.execute(plan)
        for u in scheduler.update(plan, out):
            outputs[u.req_id].extend(u.new_token_ids)
        scheduler.check_integrity()
    assert failed == 1 and not scheduler.has_unfinished()
    want = roomy_outputs(SPECS)
    assert victims
    for r in victims:  # recomputed instead of swapped back in: same tokens
        assert outputs[r] == want[r]
    for r, got in outputs.items():
        assert got == want[r][: len(got)]


@st.composite
def disk_workloads(draw):
    """Shared prefixes (spill and reload), tight pools (swap to disk), sometimes faults."""
    prefixes = [list(range(5 + 9 * k, 5 + 9 * k + draw(st.integers(4, 16)))) for k in range(2)]
    specs = []
    for i in range(draw(st.integers(3, 8))):
        prompt = draw(st.sampled_from(prefixes + [[]])) + draw(
            st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=12))
        specs.append(RequestSpec(f"q{i}", prompt, draw(st.integers(1, 14)),
                                 arrival_step=draw(st.integers(0, 12)),
                                 abort_step=draw(st.one_of(st.none(), st.integers(0, 40)))))
    return specs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=disk_workloads(), policy=st.sampled_from(["eager", "chunked", "slo"]),
       block_size=st.sampled_from([1, 2, 4]), swap=st.sampled_from([0, 3]),
       disk=st.sampled_from([2, 8, 64]), faults=st.sampled_from([0.0, 0.4]),
       extra=st.integers(0, 2), seed=st.integers(0, 999))
def test_disk_tier_never_changes_tokens(specs, policy, block_size, swap, disk, faults, extra,
                                        seed):
    import random

    largest = max(-(-(len(s.prompt) + s.max_tokens) // block_size) for s in specs)
    scheduler = make_scheduler(policy=policy, budget=16, max_seqs=4, block_size=block_size,
                               num_blocks=largest + extra, swap_blocks=swap, disk_blocks=disk)
    executor = FakeExecutor(VOCAB)
    rng = random.Random(seed)
    if faults:
        executor.disk_fault = lambda op, slot: rng.random() < faults
    result = run(scheduler, executor, specs)
    st_ = result.stats
    event(f"disk swap: {st_.num_disk_swap_preemptions_total > 0}")
    event(f"prefix reload: {st_.num_prefix_blocks_reloaded_total > 0}")
    event(f"disk failures: {st_.num_kv_offload_failures_total > 0}")
    for s in specs:
        got, want = result.outputs[s.req_id], reference_outputs(executor, s)
        if result.finish_reasons[s.req_id] == "abort":
            assert got == want[: len(got)]
        else:
            assert got == want
    executor.execute(scheduler.schedule())
    assert scheduler.stats().num_disk_blocks_used == scheduler.disk.num_spilled_blocks
