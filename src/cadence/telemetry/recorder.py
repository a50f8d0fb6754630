"""The engine's telemetry sink: every step and every request event goes through here.

Memory stays bounded for long-running servers: the recorder keeps the most recent `max_steps`
step records and `max_finished` finished timelines (oldest dropped first), plus the timelines of
requests still in flight. Anything that wants the whole history (the JSONL trace writer, the
server's Prometheus collectors) subscribes as a listener and is handed each record once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from cadence.core.plan import StepOutput, StepPlan
from cadence.telemetry.request_timeline import RequestTimeline
from cadence.telemetry.step_trace import StepRecord

logger = logging.getLogger(__name__)


class TelemetryListener:
    """Base for subscribers; override what you need. Called synchronously on the engine loop,
    so keep it cheap (buffer, then write)."""

    def on_step(self, record: StepRecord) -> None:
        """A step finished."""

    def on_request_finished(self, timeline: RequestTimeline) -> None:
        """A request reached a final state (stop, length, abort, error)."""

    def on_event(self, record: dict) -> None:
        """Any other timed event (e.g. a KV transfer of a disaggregated request)."""

    def close(self) -> None:
        """The recorder is shutting down: flush."""


class TelemetryRecorder:
    """Step records and request timelines, with listeners.

    Event order per request: `request_arrived` -> steps via `record_step` (first scheduled,
    tokens) -> final state, either from a finished RequestUpdate inside `record_step` or from
    `finish_request` (stop strings and aborts, which the engine decides). Events for a request
    that is unknown or already finished are ignored, so a late final update from the scheduler
    after an engine-side finish is harmless.
    """

    def __init__(self, max_steps: int = 10_000, max_finished: int = 10_000) -> None:
        if max_steps < 1 or max_finished < 1:
            raise ValueError("max_steps and max_finished must be >= 1")
        self.steps: deque[StepRecord] = deque(maxlen=max_steps)
        self._max_finished = max_finished
        self._finished: OrderedDict[str, RequestTimeline] = OrderedDict()
        self._live: dict[str, RequestTimeline] = {}
        self._listeners: list[TelemetryListener] = []
        self.num_steps_total = 0
        self.num_finished_total = 0

    # listeners -----------------------------------------------------------------------------
    def record_event(self, record: dict) -> None:
        """Hand a plain JSON-able event record (with a "type") to every listener."""
        for listener in self._listeners:
            on_event = getattr(listener, "on_event", None)
            if on_event is not None:
                on_event(record)

    def add_listener(self, listener: TelemetryListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: TelemetryListener) -> None:
        self._listeners.remove(listener)

    def close(self) -> None:
        for listener in self._listeners:
            self._call(listener.close)

    # request events ------------------------------------------------------------------------
    def request_arrived(self, req_id: str, arrival_time: float, num_prompt_tokens: int) -> None:
        self._finished.pop(req_id, None)  # an id reused after it finished starts afresh
        self._live[req_id] = RequestTimeline(
            req_id=req_id, arrival_time=arrival_time, num_prompt_tokens=num_prompt_tokens
        )

    def finish_request(self, req_id: str, reason: str, t: float) -> RequestTimeline | None:
        """Mark a request finished by the engine (stop string, abort, error)."""
        timeline = self._live.pop(req_id, None)
        if timeline is None:
            return None
        timeline.finished_time = t
        timeline.finish_reason = reason
        self._retire(timeline)
        return timeline

    def record_step(
        self,
        plan: StepPlan,
        out: StepOutput | None,
        updates: Iterable[Any],
        t_start: float,
        t_end: float,
        stats: Any = None,
    ) -> StepRecord:
        """Record one step. `updates` are the scheduler's RequestUpdates for this step; new
        tokens are stamped with t_end (when the step made them visible)."""
        live = self._live
        prompt_tokens: list[int] = []
        for c in plan.chunks:
            timeline = live.get(c.req_id)
            if timeline is not None and timeline.first_scheduled_time is None:
                timeline.first_scheduled_time = t_start
            if c.is_prefill:
                prompt_tokens.append(timeline.num_prompt_tokens if timeline is not None else 0)
        for req_id in plan.preempted:
            timeline = live.get(req_id)
            if timeline is not None:
                timeline.num_preemptions += 1

        finished: list[RequestTimeline] = []
        sampled: list[str] = []
        for u in updates:
            timeline = live.get(u.req_id)
            if timeline is None:
                continue
            if u.new_token_ids:
                sampled.append(u.req_id)
                if timeline.first_token_time is None:
                    timeline.first_token_time = t_end
                timeline.token_times.extend([t_end] * len(u.new_token_ids))
            timeline.num_output_tokens = u.num_output_tokens
            timeline.num_cached_tokens = u.num_cached_tokens
            if u.num_prompt_tokens:
                timeline.num_prompt_tokens = u.num_prompt_tokens
            if u.finished:
                timeline.finished_time = t_end
                timeline.finish_reason = u.finish_reason
                del live[u.req_id]
                finished.append(timeline)

        record = StepRecord.from_step(plan, out, t_start, t_end, stats, tuple(prompt_tokens),
                                      tuple(sampled))
        self.steps.append(record)
        self.num_steps_total += 1
        for listener in self._listeners:
            self._call(listener.on_step, record)
        for timeline in finished:
            self._retire(timeline)
        return record

    # queries -------------------------------------------------------------------------------
    def timeline(self, req_id: str) -> RequestTimeline | None:
        """The live or recently finished timeline of a request (None once evicted)."""
        return self._live.get(req_id) or self._finished.get(req_id)

    def finished_timelines(self) -> list[RequestTimeline]:
        """Recently finished timelines, oldest first (at most max_finished)."""
        return list(self._finished.values())

    @property
    def num_live(self) -> int:
        return len(self._live)

    # internals -----------------------------------------------------------------------------
    def _retire(self, timeline: RequestTimeline) -> None:
        self._finished[timeline.req_id] = timeline
        while len(self._finished) > self._max_finished:
            self._finished.popitem(last=False)
        self.num_finished_total += 1
        for listener in self._listeners:
            self._call(listener.on_request_finished, timeline)

    @staticmethod
    def _call(fn, *args) -> None:
        # A broken listener must not take the engine down; it is logged, loudly, every time.
        try:
            fn(*args)
        except Exception:
            logger.exception("telemetry listener %r failed", fn)
