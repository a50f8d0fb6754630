"""Test driver for the scheduler: runs schedule -> FakeExecutor -> update loops and checks the
invariants of DESIGN.md on every step (budget, sequence cap, plan shape, positions computed
once and in order, block integrity, no empty step while work can progress)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import StepPlan
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.executor.fake_executor import FakeExecutor

VOCAB = 50
EOS = 2


def make_scheduler(
    policy: str = "chunked",
    budget: int = 64,
    max_seqs: int = 8,
    block_size: int = 4,
    num_blocks: int = 256,
    threshold: int = 0,
    scheduling: str = "fcfs",
    prefix_caching: bool = True,
    max_model_len: int = 8192,
    partial_prefills: int | None = None,
    long_partial_prefills: int = 1,
    swap_blocks: int = 0,
    disk_blocks: int = 0,
    prefix_spill: bool = True,
) -> Scheduler:
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_partial_prefills=partial_prefills,
            max_long_partial_prefills=long_partial_prefills,
            policy=policy,
            max_num_batched_tokens=budget,
            max_num_seqs=max_seqs,
            long_prefill_token_threshold=threshold,
            max_model_len=max_model_len,
            scheduling=scheduling,
        ),
        CacheConfig(
            block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix_caching,
            num_swap_blocks=swap_blocks,
            # The scheduler never touches the directory (the executor does): any name works.
            kv_offload_dir="fake-disk-tier" if disk_blocks else None,
            kv_offload_disk_blocks=max(1, disk_blocks), kv_offload_prefix_spill=prefix_spill,
        ),
    )
    # A fast disk (as measured on an SSD with the page cache): the cost choice then picks the
    # disk tier for any block of a few tokens (recompute is modelled at 1 ms a token).
    scheduler.disk_block_write_s = scheduler.disk_block_read_s = 1e-4
    return scheduler


def make_request(
    req_id: str,
    prompt: Iterable[int],
    max_tokens: int = 8,
    priority: int = 0,
    arrival_time: float = 0.0,
    **sampling_kwargs,
) -> Request:
    sampling_kwargs.setdefault("eos_token_ids", (EOS,))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling_kwargs)
    return Request(req_id, list(prompt), params, arrival_time=arrival_time, priority=priority)


@dataclass
class RequestSpec:
    """A request to add at a given step (and maybe abort at a later one)."""

    req_id: str
    prompt: list[int]
    max_tokens: int
    arrival_step: int = 0
    priority: int = 0
    abort_step: int | None = None
    # Abort between schedule() and update() of that step (its chunk is then computed for nothing).
    abort_mid_step: bool = False
    # "abort" (client went away) or "stop" (the engine found a stop string).
    abort_reason: str = "abort"
    sampling_kwargs: dict = field(default_factory=dict)

    def build(self) -> Request:
        return make_request(
            self.req_id,
            self.prompt,
            self.max_tokens,
            priority=self.priority,
            arrival_time=float(self.arrival_step),
            **self.sampling_kwargs,
        )


@dataclass
class RunResult:
    outputs: dict[str, list[int]]
    finish_reasons: dict[str, str]
    error_messages: dict[str, str]
    plans: list[StepPlan]
    computed: list[tuple[str, int, int]]
    num_preemptions: int
    # Tokens (prompt + output) of each request when it finished.
    final_num_tokens: dict[str, int]
    stats: object = None


class PositionTracker:
    """Checks each request's chunks start where its last one ended, except after preemption
    (then it restarts at a block boundary), and that a first chunk starts at its cache hit."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.next_start: dict[str, int | None] = {}

    def preempted(self, req_id: str) -> None:
        self.next_start[req_id] = None

    def chunk(self, req_id: str, start: int, end: int) -> None:
        expected = self.next_start.get(req_id)
        if expected is None:
            assert start % self.block_size == 0, f"{req_id} restarts mid-block at {start}"
        else:
            assert start == expected, f"{req_id}: chunk at {start}, expected {expected}"
        assert end > start
        self.next_start[req_id] = end


def check_plan(scheduler: Scheduler, plan: StepPlan) -> None:
    """Invariants of one plan against the scheduler state it was built from."""
    cfg = scheduler.sched
    ids = [c.req_id for c in plan.chunks]
    assert len(ids) == len(set(ids)), f"a request twice in one step: {ids}"
    assert len(plan.chunks) <= cfg.max_num_seqs
    if plan.num_tokens > cfg.max_num_batched_tokens:
        # The one documented exception: eager runs an over-budget prompt whole, alone.
        assert cfg.policy == "eager" and len(plan.chunks) == 1, (
            f"step of {plan.num_tokens} tokens over budget {cfg.max_num_batched_tokens}"
        )
        assert plan.chunks[0].is_prefill
    assert plan.block_size == scheduler.cache.block_size
    for c in plan.chunks:
        req = scheduler.get_request(c.req_id)
        assert req is not None and not req.is_finished
        assert c.num_new_tokens >= 1
        assert c.start_pos == req.num_computed_tokens
        assert c.token_ids == tuple(req.all_token_ids[c.start_pos : c.end_pos])
        assert c.end_pos <= req.num_tokens
        assert c.sample == (c.end_pos == req.num_tokens)
        assert c.output_index == req.num_output_tokens
        prompt_done = c.start_pos >= req.num_prompt_tokens
        is_decode = c.num_new_tokens == 1 and prompt_done and req.num_output_tokens > 0
        assert c.is_prefill == (not is_decode)
        assert len(c.block_table) == -(-c.end_pos // plan.block_size)
    for req_id in plan.preempted:
        assert req_id not in ids


def run(
    scheduler: Scheduler,
    executor: FakeExecutor,
    specs: list[RequestSpec],
    max_steps: int = 5000,
) -> RunResult:
    """Drive the scheduler to completion with arrivals and aborts at given steps."""
    outputs = {s.req_id: [] for s in specs}
    finish_reasons: dict[str, str] = {}
    error_messages: dict[str, str] = {}
    final_num_tokens: dict[str, int] = {}
    plans: list[StepPlan] = []
    tracker = PositionTracker(scheduler.cache.block_size)
    computed_before = len(executor.computed)
    step = 0
    last_arrival = max((s.arrival_step for s in specs), default=0)
    while step <= last_arrival or scheduler.has_unfinished():
        assert step < max_steps, f"no progress after {max_steps} steps: {scheduler.stats()}"
        for s in specs:
            if s.arrival_step == step:
                scheduler.add_request(s.build())
            if s.abort_step == step and not s.abort_mid_step:
                abort(scheduler, s)
        live = scheduler.stats()
        plan = scheduler.schedule()
        check_plan(scheduler, plan)
        if plan.is_empty:
            # Empty only when nothing waits or runs (arrivals still to come, or only final
            # reports of aborted/failed requests are pending).
            s = scheduler.stats()
            assert s.num_running == 0 and s.num_waiting == 0, (
                f"empty step while work can progress: before {live}, after {s}"
            )
        for req_id in plan.preempted:
            tracker.preempted(req_id)
        for c in plan.chunks:
            tracker.chunk(c.req_id, c.start_pos, c.end_pos)
        out = executor.execute(plan)
        for req_id in out.skipped_req_ids:  # its KV could not be read: it restarts
            tracker.preempted(req_id)
        for s in specs:
            if s.abort_step == step and s.abort_mid_step:
                abort(scheduler, s)
        for u in scheduler.update(plan, out):
            assert u.req_id not in finish_reasons, f"{u.req_id} reported after finishing"
            outputs[u.req_id].extend(u.new_token_ids)
            assert u.num_output_tokens == len(outputs[u.req_id])
            if u.finished:
                finish_reasons[u.req_id] = u.finish_reason
                final_num_tokens[u.req_id] = u.num_prompt_tokens + u.num_output_tokens
                if u.error_message:
                    error_messages[u.req_id] = u.error_message
        scheduler.check_integrity()
        st = scheduler.stats()
        assert st.num_blocks_free + st.num_blocks_used == st.num_blocks_total
        assert 0 <= st.num_blocks_cached <= st.num_blocks_free
        assert 0 <= st.prefix_cache_hits <= st.prefix_cache_queries
        plans.append(plan)
        step += 1
    assert set(finish_reasons) == {s.req_id for s in specs}, "a request was lost"
    return RunResult(
        outputs=outputs,
        finish_reasons=finish_reasons,
        error_messages=error_messages,
        plans=plans,
        computed=executor.computed[computed_before:],
        num_preemptions=scheduler.stats().num_preemptions_total,
        final_num_tokens=final_num_tokens,
        stats=scheduler.stats(),
    )


def abort(scheduler: Scheduler, spec: RequestSpec) -> None:
    req = scheduler.get_request(spec.req_id)
    abortable = req is not None and not req.is_finished
    assert scheduler.abort_request(spec.req_id, reason=spec.abort_reason) == abortable


def reference_outputs(executor: FakeExecutor, spec: RequestSpec) -> list[int]:
    """What one unscheduled greedy run of the fake model gives for this request."""
    kwargs = spec.sampling_kwargs
    stop_ids = set(kwargs.get("stop_token_ids", ()))
    if not kwargs.get("ignore_eos", False):
        stop_ids |= set(kwargs.get("eos_token_ids", (EOS,)))
    min_tokens = kwargs.get("min_tokens", 0)
    history, out = list(spec.prompt), []
    while len(out) < spec.max_tokens:
        token = executor.next_token(history)
        out.append(token)
        history.append(token)
        if token in stop_ids and len(out) >= min_tokens:
            break
    return out


class ScriptedExecutor:
    """Samples token `script[req_id][output_index]` (for tests of stop conditions)."""

    def __init__(self, script: dict[str, list[int]]) -> None:
        self.script = script

    def execute(self, plan: StepPlan):
        from cadence.core.plan import SampledToken, StepOutput

        sampled = {
            c.req_id: SampledToken(self.script[c.req_id][c.output_index])
            for c in plan.chunks
            if c.sample
        }
        return StepOutput(plan.step_id, sampled)


def step(scheduler: Scheduler, executor) -> tuple[StepPlan, list]:
    """One schedule -> execute -> update round, with integrity checked."""
    plan = scheduler.schedule()
    check_plan(scheduler, plan)
    updates = scheduler.update(plan, executor.execute(plan))
    scheduler.check_integrity()
    return plan, updates


def chunk_sizes(plan: StepPlan) -> dict[str, int]:
    return {c.req_id: c.num_new_tokens for c in plan.chunks}
