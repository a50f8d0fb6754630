"""Prometheus series of prefill/decode interference, on the server's registry.

- `cadence:decode_step_time_seconds{prefill_tokens_bucket}`: histogram of the duration of
  every step that decoded, labelled by how many prompt tokens rode along in it ("0" = a pure
  decode step). The buckets side by side are the interference: same decode work, longer steps.
- `cadence:stall_seconds_total{cause}` / `cadence:stalls_total{cause}`: stream gaps over the ITL
  target, counted and summed (seconds above the stream's solo ITL), by cause (prefill,
  preemption, idle, slow_step; cadence.telemetry.attribution).
- `cadence:interference_caused_seconds_total{prompt_tokens_bucket}`: decode time lost by
  streams to other requests' prompts, by the causing prompt's length bucket.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from cadence.telemetry.attribution import CAUSES, Stall, token_bucket
from cadence.telemetry.prometheus import ITL_BUCKETS, PREFIX


class InterferenceMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels = ["model_name"]
        self._step_time = Histogram(
            PREFIX + "decode_step_time_seconds",
            "Duration of engine steps that decoded, by the prompt tokens co-scheduled in them.",
            labels + ["prefill_tokens_bucket"], buckets=ITL_BUCKETS, registry=registry)
        self._stall_s = Counter(
            PREFIX + "stall_seconds", "Stream gaps over the ITL target: seconds above the "
            "stream's solo ITL, by cause.", labels + ["cause"], registry=registry)
        self._stalls = Counter(PREFIX + "stalls", "Stream gaps over the ITL target, by cause.",
                               labels + ["cause"], registry=registry)
        self._caused = Counter(
            PREFIX + "interference_caused_seconds", "Decode time streams lost to other "
            "requests' prompt chunks, by the causing prompt's length.",
            labels + ["prompt_tokens_bucket"], registry=registry)
        for cause in CAUSES:  # every cause shows, at 0, from the start
            self._stall_s.labels(model_name, cause)
            self._stalls.labels(model_name, cause)

    def observe_step(self, step: Mapping[str, Any]) -> None:
        if not step.get("num_decode_tokens"):
            return
        duration = max(0.0, float(step["t_end"]) - float(step["t_start"]))
        bucket = token_bucket(int(step.get("num_prefill_tokens") or 0))
        self._step_time.labels(self.model_name, bucket).observe(duration)

    def observe_stall(self, stall: Stall) -> None:
        self._stalls.labels(self.model_name, stall.cause).inc()
        self._stall_s.labels(self.model_name, stall.cause).inc(stall.excess_s)

    def observe_caused(self, prompt_tokens: int, seconds: float) -> None:
        if seconds > 0:
            self._caused.labels(self.model_name, token_bucket(prompt_tokens)).inc(seconds)
