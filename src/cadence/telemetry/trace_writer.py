"""`--trace FILE`: every step and finished request as one JSON object per line.

Lines look like {"type": "step", ...StepRecord fields} and
{"type": "request", ...RequestTimeline.to_dict()}. With `stall_target_s` the writer also
attributes interference as steps come in (cadence.telemetry.attribution): a first line
{"type": "meta", "target_itl_s", ...meta}, a {"type": "stall", ...Stall.to_dict()} line per gap
over the target, and at close one {"type": "interference", ...} line per request (ms suffered
and caused). The file is buffered and flushed every `flush_every` lines and on close, so the
engine loop never waits on the disk per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from cadence.telemetry.attribution import InterferenceTracker
from cadence.telemetry.recorder import TelemetryListener
from cadence.telemetry.request_timeline import RequestTimeline
from cadence.telemetry.step_trace import StepRecord


class TraceWriter(TelemetryListener):
    """A TelemetryListener writing JSON lines; use as a context manager or call close()."""

    def __init__(self, path: str | Path, flush_every: int = 256,
                 stall_target_s: float | None = None, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        try:
            self._file = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot open trace file {self.path}: {exc}") from exc
        self._flush_every = max(1, flush_every)
        self._pending = 0
        self._tracker = InterferenceTracker(stall_target_s) if stall_target_s else None
        if self._tracker is not None or meta:
            self._write({"type": "meta", "target_itl_s": stall_target_s, **(meta or {})})

    def on_step(self, record: StepRecord) -> None:
        self._write({"type": "step", **record.to_dict()})
        if self._tracker is not None:
            for stall in self._tracker.add_step(record):
                self._write({"type": "stall", **stall.to_dict()})

    def on_request_finished(self, timeline: RequestTimeline) -> None:
        self._write({"type": "request", **timeline.to_dict()})
        if self._tracker is not None:
            self._tracker.forget(timeline.req_id)

    def on_event(self, record: dict[str, Any]) -> None:
        self._write(dict(record))

    def close(self) -> None:
        if self._file.closed:
            return
        if self._tracker is not None:
            for info in self._tracker.interference():
                self._write({"type": "interference", **info.to_dict()})
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, obj: dict[str, Any]) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._pending += 1
        if self._pending >= self._flush_every:
            self._file.flush()
            self._pending = 0


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a trace file, in order (for analysis scripts and tests)."""
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON trace line: {exc}") from exc
