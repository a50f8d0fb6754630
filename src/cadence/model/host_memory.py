"""The host's memory a new allocation can still get (MemAvailable on Linux): the loader's
widening budget and the engine's memory bound both read it here."""

from __future__ import annotations

import os


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; else available physical pages x page size; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
