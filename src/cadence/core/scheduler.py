"""The scheduler: decides each step's work (`schedule`) and moves counters after it (`update`).

    plan = scheduler.schedule()       # ints only: which tokens of which requests, which blocks
    out  = executor.execute(plan)     # one sampled token per chunk with sample=True
    ups  = scheduler.update(plan, out)

Finishing outside `update` (abort_request, finish_request, or a request that can never fit the
KV cache): blocks are freed at once, and the request's final RequestUpdate (finished=True, its
reason, no new tokens) is delivered exactly once by the next `update()` call, the same way as
requests that finish in a step. Until then `has_unfinished()` stays True, so an engine loop
`while has_unfinished(): step()` always sees it; an empty plan can be updated with
`StepOutput(plan.step_id)` without running the executor.
"""

from __future__ import annotations

import logging
import operator

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.disk_tier import DiskTier
from cadence.core.kv_cache_manager import KVCacheManager
from cadence.core.plan import StepOutput, StepPlan
from cadence.core.policies import make_policy
from cadence.core.protected_queue import PrefixProtectingQueue
from cadence.core.remote_kv import KVLoad, RemoteKVStage
from cadence.core.request import Request, RequestStatus
from cadence.core.request_queue import RankKey, make_waiting_queue
from cadence.core.scheduler_types import RequestUpdate, SchedulerStats
from cadence.core.step_builder import StepBuilder
from cadence.core.step_cost import StepFeatures
from cadence.core.swap import SwapSpace
from cadence.core.stop_checker import check_stop

__all__ = ["KVLoad", "RequestUpdate", "Scheduler", "SchedulerStats"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Token-budget scheduler over a paged KV cache with prefix caching and preemption."""

    def __init__(self, sched: SchedulerConfig, cache: CacheConfig,
                 sliding_window: int | None = None) -> None:
        """`sliding_window`: the model's attention window when every layer has one (Mistral):
        blocks that fall out of it are given back (KVCacheManager.release_out_of_window)."""
        if cache.num_blocks is None:
            raise ValueError("CacheConfig.num_blocks must be resolved before building a Scheduler")
        self.sched = sched
        self.cache = cache
        self.kv = KVCacheManager(cache.num_blocks, cache.block_size, cache.enable_prefix_caching,
                                 sliding_window)
        self.policy = make_policy(sched)
        # Host tier for swap preemption (None: preemption always recomputes).
        self.swap = SwapSpace(cache.num_swap_blocks) if cache.num_swap_blocks else None
        # Seconds to copy one KV block between tiers, one way (the engine measures it).
        self.swap_block_copy_s = 2e-4
        self.num_swap_preemptions_total = 0
        # Disk tier (swap when the host tier is full or absent, prefix spill): None without
        # --kv-offload-dir. Seconds to write / read one block (the engine measures them).
        self.disk = None
        if cache.kv_offload_dir is not None:
            self.disk = DiskTier(cache.kv_offload_disk_blocks, prefix_spill=(
                cache.kv_offload_prefix_spill and cache.enable_prefix_caching))
            if self.disk.prefix_spill:
                self.kv.pool.on_evict = self._spill
        self.disk_block_write_s = 2e-3
        self.disk_block_read_s = 2e-3
        # Evicted prefix blocks spilled while the current step is built: (device, slot).
        self._spills: list[tuple[int, int]] = []
        # Stages that run before the policy's own, chosen once by the config: with priority
        # scheduling a waiting request may preempt running ones that rank below it.
        self._before_policy = (
            [StepBuilder.make_room_for_waiting] if sched.scheduling == "priority" else []
        )
        # Waiting requests protect their cached prefixes from eviction (core/protected_queue.py).
        self.waiting = PrefixProtectingQueue(make_waiting_queue(sched.scheduling, self._rank),
                                             self.kv)
        self.running: list[Request] = []
        # Prefilled elsewhere, waiting for blocks or for their KV (disaggregated decode).
        self.remote = RemoteKVStage()
        # Every request not yet reported finished, by id.
        self._requests: dict[str, Request] = {}
        self._add_order: dict[str, int] = {}
        self._num_added = 0
        # Finished outside update(); their final update goes out with the next update().
        self._finished_unreported: list[Request] = []
        self._next_step_id = 0
        # The latest non-empty plan, until update() consumes it.
        self._outstanding_step_id: int | None = None
        # Interjection (schedule_interjection): requests added since the latest schedule()
        # are the ones that may run between two layers of its step; the interjected plan
        # outstanding, and the prompt tokens interjected into the current step so far.
        self._num_added_at_schedule = 0
        self._interjection_step_id: int | None = None
        self._num_interjected_tokens = 0
        self.num_interjections_total = 0
        self.num_preemptions_total = 0
        # Split streams (schedule_prefill / schedule_decodes, engine/split_stepper.py): the
        # prefill stream's plan computing on the prefill team, its requests (kept out of the
        # decode stream until update() takes the plan), and those of them that finished
        # meanwhile (an abort): their blocks are freed only then, the forward still writes them.
        self._prefill_step_id: int | None = None
        self._prefilling: dict[str, Request] = {}
        self._free_after_prefill: list[Request] = []

    # -- requests in and out ----------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a new request. Raises ValueError if its id is in use or prompt + max_tokens
        exceeds max_model_len (the server turns that into a 400)."""
        if not isinstance(req, Request):
            raise ValueError(f"add_request takes a Request, got {type(req).__name__}")
        if req.req_id in self._requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        fresh = req.status is RequestStatus.WAITING and not req.num_computed_tokens
        if not fresh or req.num_output_tokens:
            raise ValueError(f"request {req.req_id}: only fresh requests can be added")
        total = req.num_prompt_tokens + req.sampling.max_tokens
        if total > self.sched.max_model_len:
            raise ValueError(
                f"request {req.req_id}: prompt ({req.num_prompt_tokens} tokens) + max_tokens "
                f"({req.sampling.max_tokens}) = {total} tokens exceeds max_model_len "
                f"({self.sched.max_model_len})"
            )
        self._requests[req.req_id] = req
        self._add_order[req.req_id] = self._num_added
        self._num_added += 1
        self.waiting.add(req)

    def add_remote_request(self, req: Request) -> None:
        """Queue a request whose prompt another engine prefilled: it carries exactly one output
        token (sampled there) and nothing computed here. Its prompt blocks are allocated by the
        next schedule() (prefix-cache hits reused) and listed by `take_kv_loads`; the engine
        fills them and calls `finish_remote_kv`. Raises ValueError like add_request."""
        if not isinstance(req, Request) or req.num_output_tokens != 1:
            raise ValueError("add_remote_request takes a Request with its first output token")
        if req.req_id in self._requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        if req.status is not RequestStatus.WAITING or req.num_computed_tokens:
            raise ValueError(f"request {req.req_id}: only fresh requests can be added")
        total = req.num_prompt_tokens + req.sampling.max_tokens
        if total > self.sched.max_model_len:
            raise ValueError(f"request {req.req_id}: {total} tokens exceed max_model_len "
                             f"({self.sched.max_model_len})")
        self._requests[req.req_id] = req
        self._add_order[req.req_id] = self._num_added
        self._num_added += 1
        self.remote.add(req)

    def take_kv_loads(self) -> list[KVLoad]:
        """The KV loads that schedule() started since the last call (engine: start them)."""
        return self.remote.take_loads()

    def finish_remote_kv(self, req_id: str) -> bool:
        """The engine filled the request's KV blocks: it joins `running` at the next schedule()
        (seat permitting). False when it is no longer loading (aborted meanwhile)."""
        req = self.remote.finish_load(req_id)
        if req is None:
            return False
        self.kv.cache_computed_blocks(req)
        self.kv.release_out_of_window(req)
        return True

    def waits_only_on_remote_kv(self) -> bool:
        """True when every unfinished request is loading its KV or queued for blocks that only
        a freed lease can give: a step would do nothing until a transfer or a lease ends (the
        engine loop then blocks instead of spinning)."""
        stuck = len(self.remote.loading) + len(self.remote.queued)
        if not stuck or len(self._requests) != stuck:
            return False
        return not self.remote.queued or not self.remote.can_admit_head(self.kv)

    def release_kv_lease(self, req_id: str) -> bool:
        """Free the blocks a finished `hold_kv_on_finish` request left leased."""
        return self.kv.release_lease(req_id)

    def abort_request(self, req_id: str, reason: str = "abort") -> bool:
        """Finish a request in any state, freeing its blocks now. Returns False if unknown or
        already finished. Its final update comes with the next update()."""
        return self.finish_request(req_id, reason)

    def finish_request(self, req_id: str, reason: str = "stop") -> bool:
        """Like abort_request with another reason ("stop" for stop strings the engine found)."""
        status = RequestStatus.from_finish_reason(reason)
        req = self._requests.get(req_id)
        if req is None or req.is_finished:
            return False
        self._finish(req, status)
        self._finished_unreported.append(req)
        return True

    def get_request(self, req_id: str) -> Request | None:
        return self._requests.get(req_id)

    def has_unfinished(self) -> bool:
        """True while any request waits, runs, or has a final update not yet delivered."""
        return bool(self._requests)

    # -- the step ---------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide the next step. Nothing counts as computed until update(plan, out); a plan
        that is never updated (its forward failed) is simply dropped, and its tokens are
        scheduled again. Only the latest plan can be updated."""
        preempted: list[str] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        disk_out: list[tuple[int, int]] = []
        disk_in: list[tuple[int, int]] = []
        # Disaggregated decode (a stage before the policy): loaded requests take free seats,
        # queued ones take the blocks their KV will land in.
        self.remote.start_ready(self.running, self.sched.max_num_seqs)
        self.remote.admit(self.kv, self.sched.max_num_seqs - len(self.running),
                          self._fail_request, reserved=self._blocks_for_next_decodes())
        while True:
            num_failed = len(self._finished_unreported)
            step = StepBuilder(
                kv=self.kv,
                running=self.running,
                waiting=self.waiting,
                max_num_batched_tokens=self.sched.max_num_batched_tokens,
                max_num_seqs=self.sched.max_num_seqs,
                rank=self._rank,
                fail=self._fail_request,
                preempted_before=preempted,
                swap=self.swap,
                choose_tier=self._choose_tier,
                disk=self.disk,
            )
            for stage in self._before_policy:
                stage(step)
            self.policy.build(step)
            preempted += step.preempted
            swap_out += step.swap_out
            swap_in += step.swap_in
            disk_out += step.disk_out
            disk_in += step.disk_in
            # A request that failed (cannot fit the cache) freed its blocks and its seat after
            # the policy had passed others over: build again rather than emit an empty step.
            # Each round fails at least one more request, so this ends.
            if not step.is_empty or len(self._finished_unreported) == num_failed:
                break
        # Spilled prefix blocks are written first: allocation in this step reuses them.
        disk_out = self._spills + disk_out
        self._spills = []
        plan = self._close_step(step, preempted, swap_out, swap_in, disk_out, disk_in)
        self._outstanding_step_id = None if plan.is_empty else plan.step_id
        self._num_added_at_schedule = self._num_added
        self._num_interjected_tokens = 0
        return plan

    # -- split streams: prompt chunks on the prefill team, decodes on the decode team --------
    @property
    def prefill_in_flight(self) -> bool:
        """Whether a schedule_prefill() plan is computing (not yet updated or dropped)."""
        return self._prefill_step_id is not None

    def num_prompt_tokens_waiting(self) -> int:
        """Prompt tokens still to compute outside the prefill stream's plan in flight: the
        waiting requests' and those of running requests part-way through their prompt."""
        waiting = sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)
        partial = sum(r.num_remaining_tokens for r in self.running
                      if r.num_remaining_tokens > 1 and r.req_id not in self._prefilling)
        return waiting + partial

    def num_decode_rows(self) -> int:
        """Running requests the decode stream serves (prompt done, not in the prefill stream)."""
        return sum(1 for r in self.running
                   if r.num_remaining_tokens == 1 and r.req_id not in self._prefilling)

    def _close_step(self, step: StepBuilder, preempted, swap_out, swap_in, disk_out,
                    disk_in) -> StepPlan:
        """Build the plan of a main-stream step (schedule() or the decode stream's) and close the
        step on every tier: discards taken, swap/disk steps ended, step id and preemption counters
        advanced."""
        discard = self.disk.take_discards() if self.disk is not None else ()
        plan = step.build_plan(self._next_step_id, preempted, swap_out, swap_in,
                               disk_out, disk_in, discard)
        if self.swap is not None:
            self.swap.end_step()
        if self.disk is not None:
            self.disk.end_step()
        self._next_step_id += 1
        self.num_preemptions_total += len(plan.preempted)
        self.num_swap_preemptions_total += sum(1 for r in plan.preempted if self._swapped(r))
        return plan

    def _side_step(self, admitted: list[Request], budget: int, **tiers) -> StepBuilder:
        """A builder for a plan beside the main stream's (the prefill stream's, an interjection):
        it admits into `admitted` only, from the seats the running requests leave free."""
        return StepBuilder(
            kv=self.kv,
            running=admitted,
            waiting=self.waiting,
            max_num_batched_tokens=budget,
            max_num_seqs=self.sched.max_num_seqs - len(self.running),
            rank=self._rank,
            fail=self._fail_request,
            **tiers,
        )

    def schedule_prefill(self, max_tokens: int) -> StepPlan | None:
        """The prefill stream's next plan, for the prefill team while the decode stream steps:
        prompt work only, at most `max_tokens` tokens, from free seats and free blocks (it never
        preempts; the blocks the running requests' next tokens need are left free). Short
        prompts waiting go first, then prompts part-way through, then the other waiting ones.
        None when nothing fits. Its requests stay out of schedule_decodes() until update()
        takes the plan (or drop_prefill() drops it): the hand-over to the decode stream is that
        state change, the KV stays in its blocks."""
        if self._prefill_step_id is not None:
            raise RuntimeError("a prefill-stream plan is already in flight")
        reserved = self._blocks_for_next_decodes()
        partial = [r for r in self.running if r.num_remaining_tokens > 1]
        admitted: list[Request] = []
        step = self._side_step(admitted, max_tokens, swap=self.swap, disk=self.disk)

        def whole(remaining: int, left: int, _first: bool) -> int:
            return min(remaining, left)

        short = self.sched.long_prompt_threshold
        step.admit_waiting_where(whole, lambda r: r.num_tokens <= short, reserved=reserved)
        step.continue_without_preempting(sorted(partial, key=self._rank), whole, reserved)
        step.admit_waiting_where(whole, lambda r: True, reserved=reserved)
        self.running.extend(admitted)
        if step.is_empty:
            return None
        disk_out, self._spills = self._spills, []
        plan = step.build_plan(self._next_step_id, [], [], None, disk_out, None, ())
        if self.swap is not None:
            self.swap.end_step()
        if self.disk is not None:
            self.disk.end_step()
        self._next_step_id += 1
        self._prefill_step_id = plan.step_id
        self._prefilling = {c.req_id: self._requests[c.req_id] for c in plan.chunks}
        # Short prompts added from now on may be interjected into this plan's forward
        # (--core-split interleave), as into a schedule() plan's.
        self._num_added_at_schedule = self._num_added
        self._num_interjected_tokens = 0
        return plan

    def schedule_decodes(self) -> StepPlan:
        """The decode stream's next plan: the next token of every running request whose prompt
        is done, none of the prefill stream's. Admits nobody (prompts are the prefill stream's);
        when blocks run out it preempts among its own requests only (those of the prefill
        stream keep every block their forward writes). Updated like any schedule() plan."""
        hidden_ids = {r.req_id for r in self.running
                      if r.req_id in self._prefilling or r.num_remaining_tokens != 1}
        decoders = [r for r in self.running if r.req_id not in hidden_ids]
        # The victims protect their prefixes from the moment they are preempted, as in
        # schedule(): the step's later allocations evict other cached blocks first.
        preempted_to = PrefixProtectingQueue(
            make_waiting_queue(self.sched.scheduling, self._rank), self.kv)
        step = StepBuilder(
            kv=self.kv,
            running=decoders,
            waiting=preempted_to,
            max_num_batched_tokens=self.sched.max_num_batched_tokens,
            max_num_seqs=self.sched.max_num_seqs,
            rank=self._rank,
            fail=self._fail_request,
            swap=self.swap,
            choose_tier=self._choose_tier,
            disk=self.disk,
        )
        step.schedule_running(step.running_by_rank(), lambda rem, left, _first: min(rem, left))
        # The victims go back to the real queue, in the order the builder queued them.
        for req in reversed(list(preempted_to)):
            preempted_to.remove(req)
            self.waiting.add_front(req)
        kept = {r.req_id for r in decoders} | hidden_ids
        self.running = [r for r in self.running if r.req_id in kept]
        disk_out = self._spills + step.disk_out
        self._spills = []
        plan = self._close_step(step, None, None, None, disk_out, None)
        self._outstanding_step_id = None if plan.is_empty else plan.step_id
        return plan

    def drop_prefill(self, plan: StepPlan) -> None:
        """The prefill team's forward failed on `plan` (it is never updated): its requests are
        back in the scheduler's hands (the engine fails them)."""
        if plan.step_id == self._prefill_step_id:
            self._end_prefill()

    def _end_prefill(self) -> None:
        self._prefill_step_id = None
        self._prefilling = {}
        for req in self._free_after_prefill:
            self.kv.free(req)
        self._free_after_prefill = []

    # -- interjection: a short prompt run between two layers of a long step ------------------
    def may_interject(self, plan: StepPlan) -> bool:
        """Whether a short prompt arriving while `plan` computes may run between two of its
        layers (--interject-short-prompts): only into a step larger than a short prompt, with
        short prompts served first (--max-num-partial-prefills > 1)."""
        sched = self.sched
        return (sched.interject_short_prompts and sched.max_num_partial_prefills > 1
                and plan.num_tokens > sched.long_prompt_threshold)

    def interjection_wanted(self, paused: StepPlan) -> bool:
        """Cheap check, between two layers of `paused`: a short prompt arrived since it was
        scheduled, a seat is free, and the step has not yet been delayed by as many tokens
        as it computes itself."""
        if self._num_added == self._num_added_at_schedule:
            return False
        if len(self.running) >= self.sched.max_num_seqs:
            return False
        if self._num_interjected_tokens >= paused.num_tokens:
            return False
        return any(self._interjectable(r) for r in self.waiting)

    def schedule_interjection(self, paused: StepPlan) -> StepPlan | None:
        """A plan of the short prompts that arrived since `paused` was scheduled, each whole,
        to run between two of its layers (None when none fits). It takes only free seats and
        free blocks (never preempts, never swaps: every block of `paused` stays where it is);
        update() takes it like any plan, and `paused` after it."""
        if not self.interjection_wanted(paused):
            return None
        budget = min(self.sched.long_prompt_threshold,
                     paused.num_tokens - self._num_interjected_tokens)
        admitted: list[Request] = []
        step = self._side_step(admitted, budget)
        # Whole prompts only: a short prompt split across steps would wait for the long one.
        step.admit_waiting_where(lambda remaining, left, _first: remaining if remaining <= left else 0,
                                 self._interjectable, reserved=self._blocks_for_next_decodes())
        self.running.extend(admitted)
        if step.is_empty:
            return None
        # Prefix blocks evicted by this allocation are written out before its forward.
        disk_out, self._spills = self._spills, []
        plan = step.build_plan(self._next_step_id, [], [], [], disk_out, [], ())
        self._next_step_id += 1
        self._interjection_step_id = plan.step_id
        self._num_interjected_tokens += plan.num_tokens
        self.num_interjections_total += 1
        return plan

    def _interjectable(self, req: Request) -> bool:
        """A fresh short prompt added after the latest schedule() (not one the policy passed
        over: interjection serves arrivals, it does not overrule the policy)."""
        return (self._add_order.get(req.req_id, -1) >= self._num_added_at_schedule
                and req.status is RequestStatus.WAITING and not req.num_computed_tokens
                and not req.num_output_tokens and not self._swapped(req.req_id)
                and req.num_prompt_tokens <= self.sched.long_prompt_threshold)

    def update(self, plan: StepPlan, out: StepOutput) -> list[RequestUpdate]:
        """Advance counters by the computed plan, append sampled tokens, check stops, free the
        blocks of finished requests; one RequestUpdate per request with news."""
        if out.step_id != plan.step_id:
            raise ValueError(f"StepOutput of step {out.step_id} given for plan {plan.step_id}")
        if not plan.is_empty and plan.step_id not in (self._outstanding_step_id,
                                                      self._interjection_step_id,
                                                      self._prefill_step_id):
            raise ValueError(
                f"plan {plan.step_id} is not the latest scheduled step (or was already updated)"
            )
        # Validate everything before changing anything: a bad output leaves the state as it
        # was (the plan stays outstanding and can be retried or dropped).
        skipped = set(out.skipped_req_ids)
        live = []
        for chunk in plan.chunks:
            req = self._requests.get(chunk.req_id)
            if req is None or req.is_finished:
                continue  # finished (aborted) after schedule(): reported below
            if chunk.req_id in skipped:
                continue  # its KV could not be read back: recomputed (below)
            if chunk.start_pos != req.num_computed_tokens:
                raise RuntimeError(
                    f"request {req.req_id}: chunk starts at {chunk.start_pos} but "
                    f"{req.num_computed_tokens} tokens are computed"
                )
            token_id = self._sampled_token(out, req.req_id) if chunk.sample else None
            live.append((chunk, req, token_id))
        if plan.is_empty:
            pass
        elif plan.step_id == self._interjection_step_id:
            self._interjection_step_id = None
        elif plan.step_id == self._prefill_step_id:
            self._end_prefill()
        else:
            self._outstanding_step_id = None
        if out.failed_disk_slots or skipped:
            self._recover_from_disk_errors(out)
        updates: list[RequestUpdate] = []
        for chunk, req, token_id in live:
            req.num_computed_tokens = chunk.end_pos
            new_token_ids: tuple[int, ...] = ()
            if token_id is not None:
                req.append_output_token(token_id)
                new_token_ids = (token_id,)
            self.kv.cache_computed_blocks(req)
            self.kv.release_out_of_window(req)
            status = check_stop(req, self.sched.max_model_len) if chunk.sample else None
            if status is not None:
                self._finish(req, status)
            if new_token_ids or req.is_finished:
                updates.append(self._update_of(req, new_token_ids))
        for req in self._finished_unreported:
            updates.append(self._update_of(req, ()))
        self._finished_unreported.clear()
        for u in updates:
            if u.finished:
                self._forget(u.req_id)
        return updates

    def discard_plan_copies(self, plan: StepPlan) -> None:
        """The executor failed on `plan` (it is never updated): its copies out to the host or
        disk tier may not have happened, so the requests it swapped out are recomputed instead
        and the prefix blocks it spilled are forgotten (never read back as KV)."""
        for req_id in plan.preempted:
            req = self._requests.get(req_id)
            if req is None or req.is_finished or req in self.running or not self._swapped(req_id):
                continue
            if self.swap is not None:
                self.swap.release(req_id, swapped_in=False)
            if self.disk is not None:
                self.disk.release(req_id, swapped_in=False)
            req.num_computed_tokens = 0
            if req in self.waiting:
                self.kv.protect_prefix(req)  # it will look its prefix up now
        if self.disk is not None:
            for _, slot in plan.disk_out:
                if isinstance(self.disk.owner_of(slot), bytes):
                    self.disk.forget_slot(slot)

    def observe_step(self, plan: StepPlan, duration_s: float) -> None:
        """Report how long the executor took on `plan` (seconds). Policies that model step
        time (slo) learn from it; the others ignore it. Empty plans are not observed."""
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
            raise ValueError(f"duration_s must be a number of seconds, got {duration_s!r}")
        if not 0 <= duration_s < float("inf"):
            raise ValueError(f"duration_s must be finite and >= 0, got {duration_s!r}")
        # Optional hook: only a policy with a step-time model defines observe_step.
        observe = getattr(self.policy, "observe_step", None)
        if observe is not None and not plan.is_empty:
            observe(plan, float(duration_s))

    def calibrate(self, samples: list[tuple[StepPlan, float]]) -> None:
        """Seed the policy's step-time model with a short profile of this machine: (plan,
        measured executor seconds) pairs of synthetic steps. Policies without a model
        ignore it."""
        calibrate = getattr(self.policy, "calibrate", None)
        if calibrate is not None and samples:
            calibrate(list(samples))

    # -- introspection ----------------------------------------------------------------------
    def stats(self) -> SchedulerStats:
        pool = self.kv.pool
        disk = self.disk
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_blocks_total=pool.num_blocks,
            num_blocks_used=pool.num_used_blocks,
            num_blocks_free=pool.num_free_blocks,
            num_blocks_cached=pool.num_cached_free_blocks,
            num_preemptions_total=self.num_preemptions_total,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_waiting_for_kv=len(self.remote),
            num_leased_blocks=self.kv.num_leased_blocks,
            itl_target_s=self.sched.target_itl_ms / 1000.0 if self._models_steps else None,
            itl_target_reachable_s=getattr(self.policy, "reachable_itl_s", None),
            num_swap_preemptions_total=self.num_swap_preemptions_total,
            num_interjections_total=self.num_interjections_total,
            num_blocks_swapped_out_total=self.swap.num_blocks_swapped_out if self.swap else 0,
            num_blocks_swapped_in_total=self.swap.num_blocks_swapped_in if self.swap else 0,
            num_disk_swap_preemptions_total=disk.num_swap_preemptions if disk else 0,
            num_blocks_disk_swapped_out_total=disk.num_blocks_swapped_out if disk else 0,
            num_blocks_disk_swapped_in_total=disk.num_blocks_swapped_in if disk else 0,
            num_prefix_blocks_spilled_total=disk.num_blocks_spilled if disk else 0,
            num_prefix_blocks_reloaded_total=disk.num_blocks_reloaded if disk else 0,
            num_disk_blocks_used=disk.num_used_blocks if disk else 0,
            num_disk_blocks_total=disk.num_blocks if disk else 0,
            num_kv_offload_failures_total=disk.num_io_failures if disk else 0,
        )

    @property
    def _models_steps(self) -> bool:
        return hasattr(self.policy, "observe_step")

    def check_integrity(self) -> None:
        """Raise if blocks or queues are inconsistent (tests call this after every step)."""
        self.kv.check_integrity()
        if len(self.running) > self.sched.max_num_seqs:
            raise RuntimeError(f"{len(self.running)} running > max_num_seqs")
        for req in self.running:
            if req.status is not RequestStatus.RUNNING or not self.kv.holds_blocks(req.req_id):
                raise RuntimeError(f"running {req} is not RUNNING with blocks")
        protecting = self.kv.protecting_ids()
        if not protecting <= {r.req_id for r in self.waiting}:
            raise RuntimeError("a request not waiting protects a prefix")
        for req in self.waiting:
            if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise RuntimeError(f"waiting {req} has status {req.status}")
            swapped = self._swapped(req.req_id)
            if self.kv.holds_blocks(req.req_id) or (req.num_computed_tokens and not swapped):
                raise RuntimeError(f"waiting {req} holds blocks or computed tokens")
            looks_up = (self.kv.enable_prefix_caching and not req.num_computed_tokens
                        and req.takes_prefix_hits)
            if looks_up != (req.req_id in protecting):
                raise RuntimeError(f"waiting {req}: prefix protected is not {looks_up}")
        if self.swap is not None:
            self.swap.check_integrity()
        if self.disk is not None:
            self.disk.check_integrity()
        self.remote.check_integrity(self.kv)
        live = {r.req_id for r in self.running} | {r.req_id for r in self.waiting}
        live |= {r.req_id for r in self.remote}
        unreported = {r.req_id for r in self._finished_unreported}
        if live | unreported != set(self._requests) or live & unreported:
            raise RuntimeError("request registry does not match running + waiting + unreported")

    # -- internals --------------------------------------------------------------------------
    def _rank(self, req: Request) -> RankKey:
        """Service order; the largest key is the preemption victim (lowest priority, latest
        arrival). FCFS ignores priority."""
        order = self._add_order[req.req_id]
        if self.sched.scheduling == "priority":
            return (req.priority, req.arrival_time, order)
        return (req.arrival_time, order)

    def _finish(self, req: Request, status: RequestStatus, message: str | None = None) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            self.remote.discard(req)
        if req.req_id in self._prefilling:
            self._free_after_prefill.append(req)  # the prefill team still writes its blocks
        elif req.hold_kv_on_finish and status in (RequestStatus.FINISHED_STOPPED,
                                                  RequestStatus.FINISHED_LENGTH):
            self.kv.lease(req)  # the decode side pulls it; the engine releases the lease
        else:
            self.kv.free(req)
        if self.swap is not None:
            self.swap.release(req.req_id, swapped_in=False)
        if self.disk is not None:
            self.disk.release(req.req_id, swapped_in=False)
        req.set_finished(status, message)

    def _blocks_for_next_decodes(self) -> int:
        """Free blocks that the running requests' next token needs (kept out of admissions
        that run before the policy, so they do not cause preemptions)."""
        return sum(self.kv.num_free_blocks_needed(r, 1) for r in self.running)

    def _swapped(self, req_id: str) -> bool:
        return ((self.swap is not None and self.swap.holds(req_id))
                or (self.disk is not None and self.disk.holds(req_id)))

    def _recompute_s(self, num_tokens: int) -> float:
        """Predicted seconds to compute `num_tokens` prompt tokens again (the policy's
        step-time model when it has one, else 1 ms a token)."""
        model = getattr(self.policy, "cost_model", None)
        if model is not None:
            return model.predict(StepFeatures.of_chunk(0, num_tokens)) - model.predict(
                StepFeatures())
        return 1e-3 * num_tokens

    def _choose_tier(self, req: Request, num_blocks: int) -> str | None:
        """Where a preempted request's `num_blocks` full blocks go: the cheapest tier with
        room whose copy out and back is predicted cheaper than recomputing them ("host" or
        "disk"), else None (recompute)."""
        options = []
        if self.swap is not None and num_blocks <= self.swap.num_free_blocks:
            options.append((2 * num_blocks * self.swap_block_copy_s, "host"))
        if self.disk is not None and self.disk.has_room(num_blocks):
            options.append((num_blocks * (self.disk_block_write_s + self.disk_block_read_s),
                            "disk"))
        if not options:
            return None
        cost, tier = min(options)
        return tier if cost < self._recompute_s(num_blocks * self.cache.block_size) else None

    def _spill(self, block_id: int, block_hash: bytes) -> None:
        """An evicted prefix block: write it to the disk tier when reading it back later is
        predicted cheaper than computing it again (the write is paid now, in this step)."""
        io_s = self.disk_block_write_s + self.disk_block_read_s
        if io_s >= self._recompute_s(self.cache.block_size):
            return
        slot = self.disk.spill(block_hash)
        if slot is not None:
            self._spills.append((block_id, slot))

    def _recover_from_disk_errors(self, out: StepOutput) -> None:
        """Disk I/O failed in the executor: a request whose swap-out was not written, or
        whose blocks could not be read back (its chunk was left out of the forward), is
        recomputed from its tokens; a spilled prefix block that failed is forgotten."""
        disk = self.disk
        if disk is None:
            raise RuntimeError(f"step {out.step_id}: disk I/O failures without a disk tier")
        reason = out.io_error or "disk I/O failed"
        for slot in dict.fromkeys(out.failed_disk_slots):
            disk.num_io_failures += 1
            owner = disk.owner_of(slot)
            if isinstance(owner, str):
                req = self._requests.get(owner)
                disk.release(owner, swapped_in=False)
                if req is not None and not req.is_finished and req not in self.running:
                    req.num_computed_tokens = 0
                    if req in self.waiting:
                        self.kv.protect_prefix(req)  # it will look its prefix up now
                    logger.warning("request %s: swap-out to disk failed (%s); it will be "
                                   "recomputed", owner, reason)
            elif owner is not None:
                disk.forget_slot(slot)
                logger.warning("prefix block spilled to disk slot %d dropped: %s", slot, reason)
        for req_id in out.skipped_req_ids:
            req = self._requests.get(req_id)
            if req is None or req.is_finished or req not in self.running:
                continue
            logger.warning("request %s: its KV could not be read from disk (%s); it will be "
                           "recomputed", req_id, reason)
            self.kv.free(req)
            self.running.remove(req)
            req.num_computed_tokens = 0
            req.status = RequestStatus.PREEMPTED
            self.waiting.add_front(req)

    def _fail_request(self, req: Request, message: str) -> None:
        self._finish(req, RequestStatus.FINISHED_ERROR, message)
        self._finished_unreported.append(req)

    def _forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
        self._add_order.pop(req_id, None)

    @staticmethod
    def _sampled_token(out: StepOutput, req_id: str) -> int:
        sampled = out.sampled.get(req_id)
        if sampled is None:
            raise ValueError(f"step {out.step_id}: the executor sampled no token for {req_id}")
        try:
            # operator.index accepts numpy / torch integer scalars, refuses floats and bools.
            token_id = operator.index(sampled.token_id)
        except TypeError:
            token_id = -1
        if isinstance(sampled.token_id, bool) or token_id < 0:
            raise ValueError(f"step {out.step_id}: bad token id {sampled.token_id!r} for {req_id}")
        return token_id

    @staticmethod
    def _update_of(req: Request, new_token_ids: tuple[int, ...]) -> RequestUpdate:
        return RequestUpdate(
            req_id=req.req_id,
            new_token_ids=new_token_ids,
            finished=req.is_finished,
            finish_reason=req.finish_reason,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            num_cached_tokens=max(0, req.num_cached_tokens),
            error_message=req.error_message,
        )
