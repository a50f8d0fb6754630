"""Build (once) and load the C++ CPU kernels (the *.cpp and *.h files beside this module).

The extension is compiled with torch.utils.cpp_extension.load into a per-user cache directory
(``$CADENCE_KERNEL_CACHE`` or ``~/.cache/cadence/kernels``), keyed by the hash of all its
sources and the torch version, so the first process pays the compile (~35 s on 2 cores: each
file compiles on its own and only bindings.cpp includes torch/extension.h) and later ones just
load the .so. Any failure (no compiler, no headers, a build error) logs one warning and returns
None: callers then use the pure-torch path. ``CADENCE_CPU_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).parent


def kernel_sources() -> list[Path]:
    """The extension's files: every .cpp is compiled, the .h files are included by them."""
    return sorted(KERNEL_DIR.glob("*.cpp")) + sorted(KERNEL_DIR.glob("*.h"))


ENV_SWITCH = "CADENCE_CPU_KERNELS"
ENV_CACHE = "CADENCE_KERNEL_CACHE"


def kernels_enabled() -> bool:
    """False when the user turned the compiled kernels off with CADENCE_CPU_KERNELS=0."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def kernel_cache_dir() -> Path:
    """Where compiled kernels live (one subfolder per source + torch version)."""
    root = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "cadence", "kernels")
    return Path(root)


@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    """The compiled extension module, or None (with a logged warning) if it cannot be built.

    Cached per process: the build or import happens at most once.
    """
    if not kernels_enabled():
        return None
    try:
        from torch.utils import cpp_extension

        sources = {path.name: path.read_bytes() for path in kernel_sources()}
        digest = hashlib.sha256(torch.__version__.encode())
        for name, text in sources.items():
            digest.update(name.encode() + b"\0" + text)
        key = digest.hexdigest()[:16]
        build_dir = kernel_cache_dir() / key
        build_dir.mkdir(parents=True, exist_ok=True)
        # Compile copies kept next to the build: ninja rebuilds when a source path changes,
        # and checkouts in different places (worktrees, CI copies) share this cache.
        for name, text in sources.items():
            local = build_dir / name
            if not local.exists() or local.read_bytes() != text:
                staging = build_dir / f".{name}.{os.getpid()}"
                staging.write_bytes(text)
                os.replace(staging, local)
        return cpp_extension.load(
            name=f"cadence_cpu_kernels_{key}",
            sources=[str(build_dir / name) for name in sources if name.endswith(".cpp")],
            build_directory=str(build_dir),
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build/import failure means "use torch"
        logger.warning("cadence CPU kernels unavailable, using the pure-torch path: %s", exc)
        return None


def cpu_kernels_for(tensor: torch.Tensor) -> ModuleType | None:
    """The kernels if `tensor` is a float32/bfloat16 CPU tensor and they could be loaded."""
    if tensor.device.type != "cpu" or tensor.dtype not in (torch.float32, torch.bfloat16):
        return None
    return load_cpu_kernels()
