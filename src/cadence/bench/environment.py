"""Where a benchmark ran: versions, host, CPUs (the numbers mean little without it)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

_PACKAGES = ("cadence", "numpy", "httpx", "rich", "matplotlib", "prometheus-client", "torch")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe_environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
        "packages": {name: package_version(name) for name in _PACKAGES},
    }
