"""The front end's live telemetry: Prometheus, interference attribution, dashboard viewers.

The engine client hands every batch's telemetry to one sink (`AsyncEngineClient.attach_metrics`).
`LiveTelemetry` is that sink: it forwards to the Prometheus collectors, runs the step records
through the InterferenceTracker (stalls and who caused them, into /metrics too), keeps bounded
ring buffers of recent steps and stalls for a viewer that connects later, and pushes small
event batches to the connected dashboard viewers. All of it runs on the server's event loop,
in the front-end process: the engine process only ships the step records it already has, so
a viewer costs the engine nothing but a share of the CPU the front end uses.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from cadence.telemetry.attribution import InterferenceTracker, Stall
from cadence.telemetry.interference_metrics import InterferenceMetrics
from cadence.telemetry.prometheus import PrometheusMetrics


def stall_event(stall: Stall) -> dict[str, Any]:
    return {
        "req_id": stall.req_id, "t_prev": stall.t_prev, "t_token": stall.t_token,
        "gap_ms": round(stall.gap_s * 1000, 1), "solo_ms": round(stall.solo_itl_s * 1000, 1),
        "excess_ms": round(stall.excess_s * 1000, 1), "cause": stall.cause,
        "step_ids": list(stall.step_ids),
        "causes": [{"req_id": c.req_id, "prompt_tokens": c.prompt_tokens,
                    "prefill_tokens": c.prefill_tokens} for c in stall.causes],
    }


class Viewer:
    """One connected dashboard: a bounded queue of events (oldest dropped when it lags)."""

    def __init__(self, max_events: int = 2048) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self.wakeup = asyncio.Event()
        self.dropped = 0

    def push(self, event: dict[str, Any]) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(event)
        self.wakeup.set()

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.events)
        self.events.clear()
        self.wakeup.clear()
        return out


class LiveTelemetry:
    """EngineMetricsSink for the server (see the module docstring)."""

    def __init__(self, metrics: PrometheusMetrics, target_itl_s: float,
                 settings: Mapping[str, Any] | None = None, max_steps: int = 1500,
                 max_stalls: int = 300) -> None:
        self.metrics = metrics
        self.target_itl_s = target_itl_s
        self.settings = dict(settings or {})
        self.tracker = InterferenceTracker(target_itl_s, keep_caused_events=True)
        self.interference = InterferenceMetrics(metrics.registry, metrics.model_name)
        self.steps: deque[dict[str, Any]] = deque(maxlen=max_steps)
        self.stalls: deque[dict[str, Any]] = deque(maxlen=max_stalls)
        self.viewers: set[Viewer] = set()
        self.last_stats: dict[str, Any] = {}
        self._last_interference_push = 0.0
        # Set on server shutdown: the viewers' event streams end (uvicorn waits for every open
        # response before it stops, and an event stream never ends by itself).
        self.closing = False

    # ---- EngineMetricsSink

    def record_request(self, record: Mapping[str, Any]) -> None:
        self.metrics.record_request(record)
        self.tracker.forget(record["req_id"])
        self._publish({"kind": "finished", "req_id": record["req_id"],
                       "num_prompt_tokens": record.get("num_prompt_tokens"),
                       "ttft": record.get("ttft"), "queue_time": record.get("queue_time"),
                       "prefill_time": record.get("prefill_time"),
                       "finish_reason": record.get("finish_reason")})

    def record_iteration(self, num_steps: int, num_prefill_tokens: int,
                         num_decode_tokens: int) -> None:
        self.metrics.record_iteration(num_steps, num_prefill_tokens, num_decode_tokens)

    def record_generated_tokens(self, num_tokens: int) -> None:
        self.metrics.record_generated_tokens(num_tokens)

    def update_engine_stats(self, stats: Mapping[str, Any]) -> None:
        self.metrics.update_engine_stats(stats)
        self.last_stats = dict(stats)

    def record_steps(self, steps: Sequence[Mapping[str, Any]]) -> None:
        stalled = False
        for step in steps:
            self.steps.append(dict(step))
            self.interference.observe_step(step)
            stalls = self.tracker.add_step(step)
            for stall in stalls:
                stalled = True
                self.interference.observe_stall(stall)
                event = stall_event(stall)
                self.stalls.append(event)
                self._publish({"kind": "stall", **event})
            events = self.tracker.caused_events
            for _, prompt, seconds in events:
                self.interference.observe_caused(prompt, seconds)
            events.clear()
            if self.viewers:
                self._publish({"kind": "step", **step})
        now = time.monotonic()
        # The per-request table: after every stall, else at most once a second.
        if self.viewers and (stalled or now - self._last_interference_push > 1.0):
            self._last_interference_push = now
            self._publish({"kind": "interference", "requests": self.interference_table()})

    # ---- viewers

    def interference_table(self, limit: int = 50) -> list[dict[str, Any]]:
        """The requests that suffered or caused the most, biggest first."""
        rows = [r for r in self.tracker.interference() if r.suffered_s > 0 or r.caused_s > 0]
        rows.sort(key=lambda r: -(r.suffered_s + r.caused_s))
        return [{"req_id": r.req_id, "prompt_tokens": r.prompt_tokens,
                 "suffered_ms": round(r.suffered_s * 1000, 1),
                 "caused_ms": round(r.caused_s * 1000, 1), "num_stalls": r.num_stalls}
                for r in rows[:limit]]

    def snapshot(self) -> dict[str, Any]:
        """What a viewer that just connected needs to draw the recent past."""
        return {"kind": "snapshot", "now": time.monotonic(), "target_itl_ms":
                self.target_itl_s * 1000, "settings": self.settings, "steps": list(self.steps),
                "stalls": list(self.stalls), "requests": self.interference_table(),
                "stats": self.last_stats,
                "stall_ms_by_cause": {k: round(v * 1000, 1)
                                      for k, v in self.tracker.stall_s_by_cause.items()}}

    def close_viewers(self) -> None:
        self.closing = True
        for viewer in self.viewers:
            viewer.wakeup.set()

    def subscribe(self) -> Viewer:
        viewer = Viewer()
        self.viewers.add(viewer)
        return viewer

    def unsubscribe(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)

    def _publish(self, event: dict[str, Any]) -> None:
        for viewer in self.viewers:
            viewer.push(event)
