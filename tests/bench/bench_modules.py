"""Import a script of benchmarks/ as a module in tests (benchmarks/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(script: str, as_name: str | None = None) -> ModuleType:
    """benchmarks/<script>.py loaded under `as_name` (default: the script's name). benchmarks/ goes
    on sys.path so the script's own sibling imports resolve, and the module is registered in
    sys.modules before it runs (dataclasses look their module up there)."""
    name = as_name or script
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
