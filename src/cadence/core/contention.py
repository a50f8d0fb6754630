"""Contention: how much slower each team's steps run beside the other's than their core share
predicts (split cores share the memory bandwidth and caches), measured per machine.

The split engine and the simulator price a step on t of C cores as C / t times the step on
every core, times this factor while the other team computes beside it. The factor is measured
on this machine (executor/contention_probe.py: at an engine's startup or by `cadence sim
--calibrate`), never assumed, and cached per machine in one JSON file, keyed by CPU model,
core count, kernel tier and model, so a later engine or simulation reuses it:
    ~/.cache/cadence/contention.json   {key: {"decode": x, "prefill": y, ...}}
CADENCE_CACHE_DIR moves the file (tests point it at a temporary directory).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Contention:
    """Slowdowns beyond the core share: decode steps on `decode_threads` threads beside a
    prefill on `prefill_threads`, over a decode step on every core times cores / decode
    threads; and the prefill chunk the same way. 1.0: no interference beyond the share."""

    decode: float
    prefill: float
    num_cores: int
    decode_threads: int = 1
    prefill_threads: int = 1
    measured_at: float = 0.0
    source: str = "measured"

    def __post_init__(self) -> None:
        for name in ("decode", "prefill"):
            value = getattr(self, name)
            if not 0 < value < 100:
                raise ValueError(f"{name} contention must be in (0, 100), got {value!r}")


# The simulator's factor where nothing was measured on this machine (a roofline profile of
# another machine): the core share alone, stated as unmeasured in its label.
UNMEASURED = Contention(1.0, 1.0, num_cores=0, source="unmeasured: core share only")


def cache_path() -> str:
    root = os.environ.get("CADENCE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cadence")
    return os.path.join(root, "contention.json")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown-cpu"


def machine_key(num_cores: int, tier: str, model: str) -> str:
    return f"{cpu_model()}|{num_cores} cores|{tier}|{model}"


def _read_all() -> dict[str, dict]:
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load_cached(key: str) -> Contention | None:
    entry = _read_all().get(key)
    if not isinstance(entry, dict):
        return None
    try:
        return Contention(**{**entry, "source": f"cached ({cache_path()})"})
    except (TypeError, ValueError):
        return None


def latest_for_machine(num_cores: int) -> Contention | None:
    """The most recent measurement on this CPU with `num_cores` cores, any tier and model
    (what the simulator uses when it is not told which)."""
    prefix = f"{cpu_model()}|{num_cores} cores|"
    best = None
    for key, entry in _read_all().items():
        if key.startswith(prefix) and isinstance(entry, dict):
            if best is None or entry.get("measured_at", 0) > best.get("measured_at", 0):
                best = entry
    if best is None:
        return None
    try:
        return Contention(**{**best, "source": f"cached ({cache_path()})"})
    except (TypeError, ValueError):
        return None


def save_cached(key: str, contention: Contention) -> None:
    """Add or replace `key`'s entry (written whole to a temporary file, then renamed)."""
    data = _read_all()
    entry = asdict(contention)
    entry["measured_at"] = entry["measured_at"] or time.time()
    entry.pop("source")
    data[key] = entry
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the engine keeps its own measurement
