"""Interference attribution: which steps, and whose prompts, made a stream stall.

Definitions (seconds on the engine clock; every name below is a field somewhere):
- gap: the time between two consecutive output tokens of one request (an ITL sample).
- window of a gap (t_prev, t_token]: the engine steps that ended inside it; the last one made
  the token. A decode stream sees exactly one step per gap unless something got in the way.
- causes of a gap: the *other* requests with prompt chunks in the window's steps, each with its
  prompt length and the prompt tokens it ran there (a long prompt computed in one step is the
  textbook cause: every stream waits for the whole prefill).
- solo ITL of a request: the median of its recent clean gaps (no prompt chunk in the window, it
  was not preempted), or of everybody's recent clean gaps until it has a few: what it gets when
  nobody prefills next to it; before any clean gap, the median recent decode-only step.
- interference suffered by a request: the sum over its gaps that had causes of
  max(0, gap - solo ITL); that excess is split over the causes by their prompt tokens in the
  window, and summed per cause request as interference caused.
- stall: a gap longer than the ITL target. Its cause label is "prefill" (other requests' prompt
  chunks in the window), "preemption" (the request itself was preempted or recomputed its
  prompt), "idle" (the steps cover less than half the gap: the engine was not stepping, e.g.
  the front end or admission held it) or "slow_step" (decode-only steps that were slow: a big
  batch, a busy host).

`InterferenceTracker` is fed step records in order (live in the server, or replayed from a trace
by `attribute_trace`) and keeps only bounded state: recent steps, recent stalls, per-request
totals of the most recent requests.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

CAUSE_PREFILL = "prefill"
CAUSE_PREEMPTION = "preemption"
CAUSE_IDLE = "idle"
CAUSE_SLOW_STEP = "slow_step"
CAUSES = (CAUSE_PREFILL, CAUSE_PREEMPTION, CAUSE_IDLE, CAUSE_SLOW_STEP)

# Prompt-token buckets shared by the /metrics labels, the dashboard and `cadence diagnose`.
TOKEN_BUCKET_EDGES = (0, 64, 256, 1024, 4096)


def token_bucket(n: int) -> str:
    """'0', '1-64', '65-256', '257-1024', '1025-4096', '>4096'."""
    if n <= 0:
        return "0"
    lo = 1
    for hi in TOKEN_BUCKET_EDGES[1:]:
        if n <= hi:
            return f"{lo}-{hi}"
        lo = hi + 1
    return f">{TOKEN_BUCKET_EDGES[-1]}"


TOKEN_BUCKETS = ("0",) + tuple(token_bucket(e) for e in TOKEN_BUCKET_EDGES[1:]) + (
    f">{TOKEN_BUCKET_EDGES[-1]}",)


@dataclass(frozen=True)
class StepFacts:
    """What attribution needs of one step (a StepRecord or its trace dict carries it all)."""

    step_id: int
    t_start: float
    t_end: float
    # (req_id, prompt tokens computed in this step, the request's prompt length)
    prefill: tuple[tuple[str, int, int], ...]
    sampled: tuple[str, ...]
    preempted: tuple[str, ...] = ()

    @classmethod
    def of(cls, step: Any) -> StepFacts:
        """From a StepRecord or a trace/wire dict with the same field names."""
        get = step.get if isinstance(step, Mapping) else (lambda k, d=None: getattr(step, k, d))
        ids = get("prefill_req_ids", ()) or ()
        chunk = get("prefill_chunk_tokens", ()) or ()
        prompt = get("prefill_prompt_tokens", ()) or ()
        return cls(
            step_id=int(get("step_id")),
            t_start=float(get("t_start")),
            t_end=float(get("t_end")),
            prefill=tuple(zip(ids, (int(x) for x in chunk),
                              (int(x) for x in (prompt or (0,) * len(ids))))),
            sampled=tuple(get("sampled_req_ids", ()) or ()),
            preempted=tuple(get("preempted_req_ids", ()) or ()),
        )


@dataclass(frozen=True)
class StallCause:
    req_id: str
    prompt_tokens: int
    prefill_tokens: int  # of its prompt computed inside the stalled gap


@dataclass(frozen=True)
class Stall:
    """One gap over the target, explained."""

    req_id: str
    t_prev: float
    t_token: float
    gap_s: float
    solo_itl_s: float
    cause: str
    step_ids: tuple[int, ...]
    causes: tuple[StallCause, ...] = ()

    @property
    def excess_s(self) -> float:
        return max(0.0, self.gap_s - self.solo_itl_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["step_ids"] = list(self.step_ids)
        d["causes"] = [asdict(c) for c in self.causes]
        d["excess_s"] = self.excess_s
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stall:
        return cls(d["req_id"], d["t_prev"], d["t_token"], d["gap_s"], d["solo_itl_s"], d["cause"],
                   tuple(d.get("step_ids", ())),
                   tuple(StallCause(**c) for c in d.get("causes", ())))


@dataclass
class RequestInterference:
    req_id: str
    prompt_tokens: int = 0
    suffered_s: float = 0.0
    caused_s: float = 0.0
    num_stalls: int = 0
    num_gaps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _SoloItl:
    """Median of recent clean gaps, per request and over everybody (bounded)."""

    MIN_OWN = 3

    def __init__(self, per_request: int = 16, overall: int = 256) -> None:
        self._per_request = per_request
        self._own: dict[str, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=overall)

    def add(self, req_id: str, gap: float) -> None:
        own = self._own.get(req_id)
        if own is None:
            own = self._own[req_id] = deque(maxlen=self._per_request)
        own.append(gap)
        self._all.append(gap)

    def solo(self, req_id: str) -> float | None:
        own = self._own.get(req_id)
        if own is not None and len(own) >= self.MIN_OWN:
            return statistics.median(own)
        return statistics.median(self._all) if self._all else None

    def forget(self, req_id: str) -> None:
        self._own.pop(req_id, None)


@dataclass
class GapWindow:
    """The steps inside one gap and the prompts they ran (besides the stalled request)."""

    causes: dict[str, list[int]] = field(default_factory=dict)  # req -> [prompt, prefill tokens]
    step_ids: list[int] = field(default_factory=list)
    covered_s: float = 0.0
    own_recompute: bool = False


class InterferenceTracker:
    """Attributes every gap of every stream as steps come in (see the module docstring)."""

    def __init__(self, target_itl_s: float, max_steps: int = 4096, max_stalls: int = 1024,
                 max_requests: int = 4096, keep_caused_events: bool = False) -> None:
        if not target_itl_s > 0:
            raise ValueError(f"target_itl_s must be > 0, got {target_itl_s}")
        self.target_itl_s = float(target_itl_s)
        self._steps: deque[StepFacts] = deque(maxlen=max_steps)
        self.stalls: deque[Stall] = deque(maxlen=max_stalls)
        self._max_requests = max_requests
        self._requests: OrderedDict[str, RequestInterference] = OrderedDict()
        self._last_token: dict[str, float] = {}
        self._solo = _SoloItl()
        # Durations of recent decode-only steps: the solo ITL before any clean gap was seen
        # (a long prompt that arrives while the first streams start has no baseline yet).
        self._decode_steps: deque[float] = deque(maxlen=64)
        self.num_stalls_total = 0
        self.stall_s_by_cause: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
        # (cause req_id, its prompt tokens, seconds caused), for a consumer that drains it
        # after every add_step (the server's /metrics); off unless asked for.
        self.caused_events: list[tuple[str, int, float]] | None = [] if keep_caused_events else None

    # ---- input

    def add_step(self, step: Any) -> list[Stall]:
        """Feed the next step (StepRecord, StepFacts or a dict); returns the stalls it closed."""
        facts = step if isinstance(step, StepFacts) else StepFacts.of(step)
        self._steps.append(facts)
        if facts.sampled and not facts.prefill:
            self._decode_steps.append(facts.t_end - facts.t_start)
        for req_id, _, prompt in facts.prefill:
            self._request(req_id).prompt_tokens = prompt
        new: list[Stall] = []
        # Fast path, the common case: a pure decode step right after the stream's previous
        # token (the window is this step alone, nothing else ran in it) and a gap under the
        # target: a clean gap, nothing to attribute.
        plain = not facts.prefill and not facts.preempted
        before = self._steps[-2].t_end if len(self._steps) > 1 else float("-inf")
        last, target, t_end = self._last_token, self.target_itl_s, facts.t_end
        for req_id in facts.sampled:
            prev = last.get(req_id)
            last[req_id] = t_end
            if prev is None:
                continue  # the first token ends the TTFT, not a gap
            if plain and prev >= before and t_end - prev <= target:
                self._solo.add(req_id, t_end - prev)
                self._request(req_id).num_gaps += 1
                continue
            stall = self._gap(req_id, prev, t_end)
            if stall is not None:
                new.append(stall)
        return new

    def forget(self, req_id: str) -> None:
        """The request finished: drop its per-gap state (its totals stay, bounded)."""
        self._last_token.pop(req_id, None)
        self._solo.forget(req_id)

    # ---- output

    def interference(self) -> list[RequestInterference]:
        return list(self._requests.values())

    def request(self, req_id: str) -> RequestInterference | None:
        return self._requests.get(req_id)

    def solo_itl_s(self, req_id: str = "") -> float | None:
        solo = self._solo.solo(req_id)
        if solo is None and self._decode_steps:
            solo = statistics.median(self._decode_steps)
        return solo

    # ---- internals

    def _request(self, req_id: str) -> RequestInterference:
        info = self._requests.get(req_id)
        if info is None:
            info = self._requests[req_id] = RequestInterference(req_id)
            while len(self._requests) > self._max_requests:
                self._requests.popitem(last=False)
        return info

    def _window(self, req_id: str, t_prev: float, t_token: float) -> GapWindow:
        w = GapWindow()
        for s in reversed(self._steps):
            if s.t_end <= t_prev:
                break
            if s.t_end > t_token:
                continue
            w.step_ids.append(s.step_id)
            w.covered_s += s.t_end - max(s.t_start, t_prev)
            if req_id in s.preempted:
                w.own_recompute = True
            for other, chunk, prompt in s.prefill:
                if other == req_id:
                    w.own_recompute = True
                    continue
                entry = w.causes.setdefault(other, [prompt, 0])
                entry[1] += chunk
        w.step_ids.reverse()
        return w

    def _gap(self, req_id: str, t_prev: float, t_token: float) -> Stall | None:
        gap = t_token - t_prev
        w = self._window(req_id, t_prev, t_token)
        info = self._request(req_id)
        info.num_gaps += 1
        if not w.causes and not w.own_recompute:
            self._solo.add(req_id, gap)
        solo = self._solo.solo(req_id)
        if solo is None:
            solo = statistics.median(self._decode_steps) if self._decode_steps else gap
        excess = max(0.0, gap - solo)
        if w.causes and excess > 0:
            info.suffered_s += excess
            total = sum(tokens for _, tokens in w.causes.values()) or 1
            for other, (prompt, tokens) in w.causes.items():
                share = excess * tokens / total
                self._request(other).caused_s += share
                if self.caused_events is not None:
                    self.caused_events.append((other, prompt, share))
        if gap <= self.target_itl_s:
            return None
        if w.causes:
            cause = CAUSE_PREFILL
        elif w.own_recompute:
            cause = CAUSE_PREEMPTION
        elif w.covered_s < 0.5 * gap:
            cause = CAUSE_IDLE
        else:
            cause = CAUSE_SLOW_STEP
        causes = tuple(sorted((StallCause(r, p, t) for r, (p, t) in w.causes.items()),
                              key=lambda c: -c.prefill_tokens))
        stall = Stall(req_id, t_prev, t_token, gap, solo, cause, tuple(w.step_ids), causes)
        info.num_stalls += 1
        self.stalls.append(stall)
        self.num_stalls_total += 1
        self.stall_s_by_cause[cause] += stall.excess_s
        return stall


@dataclass
class TraceAttribution:
    """The result of replaying a trace: every stall and every request's totals."""

    target_itl_s: float
    stalls: list[Stall]
    requests: dict[str, RequestInterference]
    stall_s_by_cause: dict[str, float]


def attribute_trace(records: Iterable[Mapping[str, Any]], target_itl_s: float) -> TraceAttribution:
    """Replay a `--trace` file's records (cadence.telemetry.trace_writer.read_trace).

    Steps written before steps carried `sampled_req_ids` get them back from the request
    records' token times (each token is stamped with its step's t_end).
    """
    steps: list[dict[str, Any]] = []
    requests: list[Mapping[str, Any]] = []
    for r in records:
        kind = r.get("type")
        if kind == "step":
            steps.append(dict(r))
        elif kind == "request":
            requests.append(r)
    steps.sort(key=lambda s: (s["t_end"], s["step_id"]))
    if steps and not any("sampled_req_ids" in s for s in steps):
        by_end: dict[float, list[str]] = {}
        for r in requests:
            for t in r.get("token_times") or ():
                by_end.setdefault(t, []).append(r["req_id"])
        for s in steps:
            s["sampled_req_ids"] = by_end.get(s["t_end"], [])
    tracker = InterferenceTracker(target_itl_s, max_steps=max(1, len(steps)),
                                  max_stalls=max(1, len(steps) * 64),
                                  max_requests=max(1, len(requests) + len(steps)))
    stalls: list[Stall] = []
    for s in steps:
        stalls.extend(tracker.add_step(s))
    info = {r.req_id: r for r in tracker.interference()}
    for r in requests:
        entry = info.setdefault(r["req_id"], RequestInterference(r["req_id"]))
        entry.prompt_tokens = int(r.get("num_prompt_tokens") or entry.prompt_tokens)
    return TraceAttribution(target_itl_s, stalls, info, dict(tracker.stall_s_by_cause))
