"""Regression: a 32-stream chat workload with prefix caching on, as `cadence serve` runs it.

A report said every request of such a run ended with an IndexError at
`request.block_hashes[i]` in KVCacheManager.cache_computed_blocks. That index is out of range
only if a request's computed tokens pass the hashes of its full blocks, i.e. if
num_computed_tokens // block_size exceeded num_tokens // block_size. These tests drive the
real scheduler through the shapes that workload has (a shared ChatML system prefix, 32
concurrent streams whose outputs cross several block boundaries, a second wave that hits the
blocks the first one cached, prompts of exactly whole blocks, stop-string finishes and client
aborts while decoding, a pool small enough to preempt and evict) under every policy, and check
after every step that the counters the prefix cache indexes by stay in range, on top of the
driver's own invariants (block integrity, positions computed once, tokens unchanged by
scheduling).
"""

from __future__ import annotations

import random

import pytest

from cadence.core.block_hash import extend_block_hashes
from cadence.core.config import POLICIES
from cadence.core.request import Request
from cadence.core.scheduler import Scheduler
from cadence.executor.fake_executor import FakeExecutor
from core_driver import EOS, VOCAB, RequestSpec, make_scheduler, reference_outputs, run

BLOCK_SIZE = 16  # the server's default
NUM_STREAMS = 32
OUTPUT_TOKENS = 48  # three blocks of output per request


def chat_specs(seed: int, abort_and_stop: bool) -> list[RequestSpec]:
    """Two waves of NUM_STREAMS chat requests sharing a system prefix (ChatML-like)."""
    rng = random.Random(seed)
    system = [1] + [rng.randrange(3, VOCAB) for _ in range(30)]  # <|im_start|>system ... user
    questions = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 40))]
                 for _ in range(NUM_STREAMS // 2)]
    specs = []
    for wave in range(2):
        for i in range(NUM_STREAMS):
            prompt = system + questions[i % len(questions)] + [1, 7, 8]  # assistant header
            if i % 8 == 0:
                # A prompt of exactly whole blocks: its last block is recomputed, not hit.
                prompt = prompt[: len(prompt) // BLOCK_SIZE * BLOCK_SIZE] or prompt
            spec = RequestSpec(f"w{wave}-{i}", prompt, OUTPUT_TOKENS, arrival_step=wave * 20,
                               sampling_kwargs={"ignore_eos": True})
            if abort_and_stop and i % 5 == 1:
                spec.abort_step = wave * 20 + 8 + i
                spec.abort_mid_step = i % 2 == 0
                spec.abort_reason = "stop" if i % 3 == 0 else "abort"
            specs.append(spec)
    return specs


class HashRangeCheckingScheduler(Scheduler):
    """After every update: each live request's computed tokens stay within its tokens, and
    its block hashes (extended as cache_computed_blocks does) cover its computed full blocks."""

    def update(self, plan, out):
        updates = super().update(plan, out)
        for req in list(self.running) + list(self.waiting):
            assert req.num_computed_tokens <= req.num_tokens, req
            hashes = list(req.block_hashes)
            extend_block_hashes(hashes, req.all_token_ids, self.kv.block_size)
            assert len(hashes) >= req.num_computed_tokens // self.kv.block_size, req
        return updates


def checking_scheduler(policy: str, num_blocks: int) -> Scheduler:
    base = make_scheduler(policy=policy, budget=512, max_seqs=64, block_size=BLOCK_SIZE,
                          num_blocks=num_blocks, prefix_caching=True)
    return HashRangeCheckingScheduler(base.sched, base.cache)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("num_blocks", [4096, 40], ids=["ample-pool", "tight-pool"])
@pytest.mark.parametrize("abort_and_stop", [False, True], ids=["plain", "aborts"])
def test_chat_streams_with_prefix_cache_keep_hashes_in_range(policy, num_blocks,
                                                              abort_and_stop):
    executor = FakeExecutor(VOCAB, eos_token_id=EOS)
    specs = chat_specs(seed=num_blocks, abort_and_stop=abort_and_stop)
    result = run(checking_scheduler(policy, num_blocks), executor, specs)
    assert result.stats.prefix_cache_hits > 0  # the shared prefix really was served
    if num_blocks == 40:
        assert result.num_preemptions > 0  # and the tight pool really preempted
    for s in specs:
        reason = result.finish_reasons[s.req_id]
        want = reference_outputs(executor, s)
        got = result.outputs[s.req_id]
        if s.abort_step is None:
            assert (reason, got) == ("length", want), s.req_id
        else:
            assert reason in ("length", s.abort_reason) and got == want[: len(got)], s.req_id


def test_cache_hit_then_decode_across_blocks_registers_every_block():
    """One request caches its prompt and outputs; an identical prompt then hits all but the
    block holding its last prompt token and decodes past several block boundaries."""
    scheduler = make_scheduler(budget=512, block_size=BLOCK_SIZE, num_blocks=64)
    executor = FakeExecutor(VOCAB, eos_token_id=EOS)
    prompt = list(range(3, 3 + 2 * BLOCK_SIZE + 5))
    for req_id in ("first", "second"):
        scheduler.add_request(Request(req_id, prompt, chat_specs(0, False)[0].build().sampling,
                                      arrival_time=0.0))
        while scheduler.has_unfinished():
            plan = scheduler.schedule()
            scheduler.update(plan, executor.execute(plan))
            scheduler.check_integrity()
    # The second request found the two full prompt blocks the first one cached.
    assert scheduler.stats().prefix_cache_hits == 2 * BLOCK_SIZE
    # Both are gone; their full blocks stay cached (prompt and output blocks alike).
    full_blocks = (len(prompt) + OUTPUT_TOKENS - 1) // BLOCK_SIZE
    assert scheduler.stats().num_blocks_cached == full_blocks
