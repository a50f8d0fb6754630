"""cadence.core must never import torch (the simulator and tests run it torch-free)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import cadence.core
names = [m.name for m in pkgutil.walk_packages(cadence.core.__path__, "cadence.core.")]
for name in names:
    importlib.import_module(name)
importlib.import_module("cadence.executor.fake_executor")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "transformers"))
print(len(names), heavy)
assert not heavy, heavy
"""


def test_core_and_fake_executor_import_without_torch():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    num_modules = int(proc.stdout.split()[0])
    assert num_modules >= 10  # every core module was really imported
