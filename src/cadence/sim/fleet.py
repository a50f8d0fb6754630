"""N replicas behind the router's replica policy, on one virtual clock.

Each replica is the simulated engine of simulator.py (the real cadence.core Scheduler, its
prefix cache included, a step cost instead of a model); the router is the real one's
ReplicaSelector (cadence.disagg.router.replicas: round-robin, least-loaded, cache-aware with the
same cost), fed what the real router knows: the requests it has in flight on each replica
(Outstanding: tokens, work, count), each replica's KV pool size, and its cached prefix blocks,
read here straight from the simulated block pool (the real router's KV events lag it by one
engine turn). Conversations (sim/conversations.py) are closed loops: a turn is sent when the
previous answer has ended plus its think time, so routing changes when later turns arrive.

Event loop: the earliest of (next turn sent, a replica's step ending). A turn is routed at once
and reaches its replica's scheduler the way the engine loop (engine/engine_loop.py) admits it:
an idle replica takes it at once; a busy one reads its socket between two layers of a step with
prompt tokens (there it joins the scheduler, and a short prompt may be interjected), but not
during a decode-only step: a turn arriving then is read at that step's end, prepared (tokenized)
in an admission thread while the loop, busy, runs its next step without it, and admitted after
that one (or during it, if it has prompt tokens). So it misses one step, which is a long prefill
step when another prompt is waiting. A replica with work starts its next step when the last
one ends. `hop_s` is what a
request spends outside the engines before its first token reaches the client (HTTP to the
router, its /tokenize call, HTTP to the replica, streaming back): added to every TTFT, and to
the time between an answer and the next turn's arrival.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field

from cadence.core.block_hash import leading_blocks_held
from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import StepOutput
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.disagg.router.replicas import PromptBlocks, ReplicaSelector
from cadence.disagg.router.workers import Outstanding, Worker
from cadence.sim.conversations import ConversationWorkload, new_token_ids, system_token_ids
from cadence.sim.cost_model import CostModel
from cadence.sim.host_cpu import HostCpu
from cadence.sim.sim_executor import HashSampler
from cadence.sim.step_jitter import StepJitter


class _PoolPrefixes:
    """What a replica's KV events tell the router, read from its simulated block pool."""

    trusted = True

    def __init__(self, scheduler: Scheduler) -> None:
        self._pool = scheduler.kv.pool
        self.block_size = scheduler.kv.block_size

    def longest_prefix_blocks(self, block_hashes: list[bytes]) -> int:
        return leading_blocks_held(block_hashes, lambda h: self._pool.get_cached_block(h) is not None)


@dataclass
class FleetRequest:
    req_id: str
    conv_id: int
    turn: int
    replica: int
    sent_s: float
    prompt_tokens: int
    expected_cached_tokens: int
    cached_tokens: int = 0
    output_tokens: int = 0
    scheduled_s: float | None = None  # the start of its first step (queue: scheduled - sent)
    ttft_s: float | None = None
    finished_s: float | None = None


@dataclass
class FleetResult:
    num_replicas: int
    policy: str
    requests: list[FleetRequest] = field(default_factory=list)
    preemptions: int = 0
    # Every step: (replica, start, seconds, prefill tokens, decode tokens, sequences), as the
    # replicas' --trace files give them (benchmarks/replica_bench.py steps-N-POLICY.json).
    steps: list[tuple[int, float, float, int, int, int]] = field(default_factory=list)

    @property
    def prefix_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over all requests (each counted once)."""
        prompt = sum(r.prompt_tokens for r in self.requests)
        return sum(r.cached_tokens for r in self.requests) / max(1, prompt)

    def ttft_percentile(self, q: float) -> float | None:
        values = sorted(r.ttft_s for r in self.requests if r.ttft_s is not None)
        if not values:
            return None
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]

    @property
    def ttft_p50(self) -> float | None:
        values = [r.ttft_s for r in self.requests if r.ttft_s is not None]
        return statistics.median(values) if values else None

    def goodput_rps(self, slo_ttft_s: float) -> float:
        ends = [r.finished_s for r in self.requests if r.finished_s is not None]
        if not ends:
            return 0.0
        span = max(ends) - min(r.sent_s for r in self.requests)
        good = sum(1 for r in self.requests if r.ttft_s is not None and r.ttft_s <= slo_ttft_s)
        return good / span if span > 0 else 0.0

    def per_replica(self) -> list[int]:
        counts = [0] * self.num_replicas
        for r in self.requests:
            counts[r.replica] += 1
        return counts


class _Replica:
    def __init__(self, index: int, sched: SchedulerConfig, cache: CacheConfig,
                 calibration: list | None) -> None:
        self.index = index
        self.scheduler = Scheduler(sched, cache)
        if calibration:
            self.scheduler.calibrate(calibration)
        # The router's view of it: its in-flight counts and its scraped pool size.
        self.worker = Worker(f"sim://replica-{index}", "decode")
        self.worker.metrics["cadence:kv_cache_blocks_total"] = float(cache.num_blocks)
        self.step_end: float | None = None  # None: idle
        self.step_s = 0.0  # the current step's cost-model seconds
        self.step_start = 0.0
        self.work_left = 0.0  # solo seconds of it (and of interjections into it) still to do
        self.interjected_s = 0.0  # wall seconds interjections added to it
        self.plan = None
        # Turns that arrived during a decode-only step (not read yet), and those read at a
        # step's end and being prepared during the next step (engine_loop's admission).
        self.inbox: list[Request] = []
        self.preparing: list[Request] = []


def simulate_fleet(workload: ConversationWorkload, num_replicas: int, policy: str,
                   cost_model: CostModel, sched: SchedulerConfig, cache: CacheConfig,
                   load_weight: float = 0.25, hop_s: float = 0.0, vocab_size: int = 49152,
                   calibration: list | None = None, host: HostCpu | None = None,
                   jitter: StepJitter | None = None, max_steps: int = 10_000_000,
                   replica_calibrations: list[list | None] | None = None) -> FleetResult:
    """Serve every conversation of `workload` on `num_replicas` simulated replicas routed by
    `policy` (round-robin | least-loaded | cache-aware); deterministic for a given input.
    `host`: the replicas share its cores with the serving stack (sim/host_cpu.py), so a step
    takes its cost model's seconds only while the cores are not oversubscribed; None: each
    replica computes on cores of its own. `jitter`: each step's time drawn from a profile's
    measured spread (sim/step_jitter.py, seeded); near saturation one run's TTFT p50 moves with
    a few steps' luck, so `cadence sim --compare` takes the median over seeds.
    `calibration` seeds every replica's scheduler (the profile samples an engine's startup
    profile would give); `replica_calibrations[i]`, where given, seeds replica i's instead:
    a measured engine's own startup profile, which its slo policy planned chunks from."""
    if num_replicas < 1:
        raise ValueError("num_replicas must be >= 1")
    own = list(replica_calibrations or [])[:num_replicas]
    own += [None] * (num_replicas - len(own))
    replicas = [_Replica(i, sched, cache, own[i] or calibration) for i in range(num_replicas)]
    selector = ReplicaSelector(policy, load_weight)
    for r in replicas:
        selector.events[r.worker.url] = _PoolPrefixes(r.scheduler)  # type: ignore[assignment]
    by_url = {r.worker.url: r for r in replicas}
    executor = HashSampler(vocab_size)
    result = FleetResult(num_replicas, policy)
    convs = {c.conv_id: c for c in workload.conversations}
    history: dict[int, list[int]] = {}  # conversation -> its tokens so far (prompts + answers)
    live: dict[str, tuple[FleetRequest, Outstanding, list[int]]] = {}
    # (time a turn is sent, conversation, turn)
    arrivals = [(c.start_s, c.conv_id, 0) for c in workload.conversations]
    heapq.heapify(arrivals)
    steps = 0
    # Processor sharing (host): the time the replicas' remaining work was last brought up to,
    # and the stack's pending pieces of work (solo seconds left, one thread each).
    shared_at = 0.0
    background: list[float] = []

    def priced(plan) -> float:
        seconds = cost_model.step_time(plan)
        return seconds * jitter.factor(plan) if jitter is not None else seconds

    def rate() -> float:
        """A busy replica's solo-seconds per second now."""
        if host is None:
            return 1.0
        return host.engine_rate(sum(1 for r in replicas if r.step_end is not None),
                                len(background))

    def stack_rate() -> float:
        return host.rate(sum(1 for r in replicas if r.step_end is not None), len(background))

    def advance(now: float) -> None:
        """Bring every busy replica's and background piece's remaining work up to `now` at the
        rate the cores gave them since the last event."""
        nonlocal shared_at, background
        if host is None:
            return
        elapsed = now - shared_at
        if elapsed > 0:
            done = elapsed * rate()
            for r in replicas:
                if r.step_end is not None:
                    r.work_left -= done
            done = elapsed * stack_rate()
            background = [w - done for w in background if w - done > 1e-9]
        shared_at = now

    def reprice(now: float) -> None:
        """Each busy replica's step end at the rate the cores give now."""
        if host is None:
            return
        share = rate()
        for r in replicas:
            if r.step_end is not None:
                r.step_end = now + max(0.0, r.work_left) / share

    def stack_work(seconds: float) -> None:
        if host is not None and seconds > 0:
            background.append(seconds)

    def send(now: float, conv_id: int, turn: int) -> None:
        conv = convs[conv_id]
        spec = conv.turns[turn]
        tokens = history.setdefault(conv_id, system_token_ids(workload, conv.system, vocab_size))
        tokens += new_token_ids(workload, conv_id, turn, spec.new_tokens, vocab_size)
        prompt = PromptBlocks(list(tokens))
        workers = [r.worker for r in replicas]
        order = selector.order(workers, prompt, len(prompt), spec.output_tokens)
        chosen = by_url[order[0].url]
        miss = selector.miss_tokens(chosen.worker, prompt)
        counter = Outstanding(chosen.worker, len(prompt) + spec.output_tokens,
                              miss + spec.output_tokens)
        counter.__enter__()
        selector.sent_to(chosen.worker, prompt)
        req_id = f"c{conv_id}-t{turn}"
        req = FleetRequest(req_id, conv_id, turn, chosen.index, now, len(prompt),
                           len(prompt) - miss)
        live[req_id] = (req, counter, [])
        stack_work(host.cpu_per_request_s if host is not None else 0.0)
        params = SamplingParams(max_tokens=spec.output_tokens, temperature=0.0, ignore_eos=True)
        request = Request(req_id, list(tokens), params, now)
        if chosen.step_end is None:
            chosen.scheduler.add_request(request)
            start_step(chosen, now)
        elif not chosen.plan.num_prefill_tokens:
            chosen.inbox.append(request)  # the loop reads its socket only at the step's end
        else:
            admit_during_step(chosen, [request], now)

    def admit_during_step(replica: _Replica, requests: list[Request], now: float) -> None:
        """The engine polls its socket between two layers of a step with prompt tokens: the
        turns join the scheduler there, and a short one may run inside the step."""
        for request in requests:
            replica.scheduler.add_request(request)
        if requests and replica.scheduler.may_interject(replica.plan):
            interject(replica, now)

    def admit_at_turn(replica: _Replica, now: float) -> None:
        """The engine loop's turn between two steps: the turns prepared during the step that
        just ended join the scheduler, those that arrived during it are read and start their
        preparation; an idle loop waits for that (a few ms, not modelled), a busy one steps
        without them."""
        ready, replica.preparing, replica.inbox = replica.preparing, replica.inbox, []
        for request in ready:
            replica.scheduler.add_request(request)
        if not replica.scheduler.has_unfinished():
            ready, replica.preparing = replica.preparing, []
            for request in ready:
                replica.scheduler.add_request(request)

    def start_step(replica: _Replica, now: float) -> None:
        nonlocal steps
        scheduler = replica.scheduler
        while scheduler.has_unfinished():
            plan = scheduler.schedule()
            if plan.is_empty:  # only failures to report (e.g. a prompt that never fits)
                for u in scheduler.update(plan, StepOutput(plan.step_id)):
                    if u.finished:
                        finish(replica, u.req_id, now, u.num_cached_tokens)
                continue
            steps += 1
            if steps > max_steps:
                raise RuntimeError(f"fleet simulation did not finish in {max_steps} steps")
            replica.plan = plan
            replica.step_s = priced(plan)
            replica.step_end = now + replica.step_s / rate()
            replica.work_left = replica.step_s
            replica.interjected_s = 0.0
            replica.step_start = now
            scheduled(plan, now)
            return
        replica.step_end = None

    def interject(replica: _Replica, now: float) -> None:
        """A short prompt arrived while `replica` computes a step: as the engine's layer hook
        does, it runs at once, whole, between two layers of that step (its first token comes
        when it is done), and the paused step ends that much later."""
        plan = replica.scheduler.schedule_interjection(replica.plan)
        if plan is None:
            return
        seconds = priced(plan)
        wall = seconds / rate()  # at the cores' share now (the next event reprices the rest)
        scheduled(plan, now)
        result.steps.append((replica.index, now, wall, plan.num_prefill_tokens,
                             plan.num_tokens - plan.num_prefill_tokens, len(plan.chunks)))
        updates = replica.scheduler.update(plan, executor.execute(plan))
        replica.step_end += wall
        replica.work_left += seconds
        replica.interjected_s += wall
        deliver(replica, updates, now + wall)

    def scheduled(plan, now: float) -> None:
        for chunk in plan.chunks:
            entry = live.get(chunk.req_id)
            if entry is not None and entry[0].scheduled_s is None:
                entry[0].scheduled_s = now

    def deliver(replica: _Replica, updates, now: float) -> None:
        if host is not None:
            stack_work(host.cpu_per_token_s * sum(len(u.new_token_ids) for u in updates))
        for u in updates:
            entry = live.get(u.req_id)
            if entry is None:
                continue
            req, _, output = entry
            if u.new_token_ids and req.ttft_s is None:
                req.ttft_s = now + hop_s - req.sent_s
            output.extend(u.new_token_ids)
            if u.finished:
                finish(replica, u.req_id, now, u.num_cached_tokens)

    def finish(replica: _Replica, req_id: str, now: float, cached: int) -> None:
        req, counter, output = live.pop(req_id)
        counter.__exit__()
        req.finished_s = now + hop_s
        req.cached_tokens = max(0, cached)
        req.output_tokens = len(output)
        history[req.conv_id] += output
        result.requests.append(req)
        conv = convs[req.conv_id]
        if req.turn + 1 < len(conv.turns):
            heapq.heappush(arrivals, (req.finished_s + conv.turns[req.turn].think_s,
                                      req.conv_id, req.turn + 1))

    def end_step(replica: _Replica) -> None:
        now = replica.step_end
        plan = replica.plan
        # What the engine's clock sees: the step's own time (an interjection's is left out, as
        # the engine observes it), stretched while the cores were shared.
        wall = replica.step_s if host is None else now - replica.step_start - replica.interjected_s
        result.steps.append((replica.index, replica.step_start, wall,
                             plan.num_prefill_tokens, plan.num_tokens - plan.num_prefill_tokens,
                             len(plan.chunks)))
        out = executor.execute(plan)
        updates = replica.scheduler.update(plan, out)
        replica.scheduler.observe_step(plan, wall)
        deliver(replica, updates, now)
        admit_at_turn(replica, now)
        start_step(replica, now)
        if replica.step_end is not None and replica.plan.num_prefill_tokens and replica.preparing:
            ready, replica.preparing = replica.preparing, []
            admit_during_step(replica, ready, now)

    while True:
        busy = [r for r in replicas if r.step_end is not None]
        next_step = min(busy, key=lambda r: (r.step_end, r.index)) if busy else None
        step_t = next_step.step_end if next_step is not None else math.inf
        stack_t = shared_at + min(background) / stack_rate() if background else math.inf
        if arrivals and arrivals[0][0] < step_t and arrivals[0][0] <= stack_t:
            t, conv_id, turn = heapq.heappop(arrivals)
            advance(t)
            send(t, conv_id, turn)
            reprice(t)
        elif next_step is not None and step_t <= stack_t:
            advance(step_t)
            end_step(next_step)
            reprice(step_t)
        elif background:
            advance(stack_t)
            reprice(stack_t)
        else:
            break
    if live:
        raise RuntimeError(f"fleet simulation ended with {len(live)} requests unfinished")
    result.requests.sort(key=lambda r: (r.sent_s, r.req_id))
    result.preemptions = sum(r.scheduler.num_preemptions_total for r in replicas)
    return result

