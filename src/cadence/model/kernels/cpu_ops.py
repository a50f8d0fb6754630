"""Build (once per tier) and load the C++ CPU kernels (the sources beside this module).

The sources are compiled once per instruction-set tier (``isa.py``: avx512bf16, avx512, avx2),
each with that tier's explicit flags, never ``-march=native``: a build made on one CPU runs on
every CPU that has its tier's features. The extension is compiled with
torch.utils.cpp_extension.load into a per-user cache directory (``$CADENCE_KERNEL_CACHE`` or
``~/.cache/cadence/kernels``), one folder per (tier, hash of all sources, flags and the torch
version), so the first process pays the compile (~35 s on 2 cores: each file compiles on its
own and only bindings.cpp includes torch/extension.h) and later ones just load the .so. The tier
that loads is the best one the CPU has, or ``CADENCE_ISA`` (a lower one, for tests). Any failure
(no compiler, no headers, a build error) logs one warning and returns None: callers then use the
pure-torch path. ``CADENCE_CPU_KERNELS=0`` (or ``CADENCE_ISA=torch``) turns the kernels off.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

from cadence.model.kernels.isa import Tier, selected_tier

logger = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).parent


def kernel_sources() -> list[Path]:
    """The extension's files (this folder and its tier subfolders): every .cpp is compiled, the
    .h files are included by them."""
    return sorted(KERNEL_DIR.glob("**/*.cpp")) + sorted(KERNEL_DIR.glob("**/*.h"))


ENV_SWITCH = "CADENCE_CPU_KERNELS"
ENV_CACHE = "CADENCE_KERNEL_CACHE"
# Kernel development: a fixed build folder per tier (this value instead of the sources' hash),
# so that ninja recompiles only the files that changed. Never set it where several checkouts
# with different sources share the cache.
ENV_BUILD_KEY = "CADENCE_KERNEL_BUILD_KEY"


def kernels_enabled() -> bool:
    """False when the user turned the compiled kernels off with CADENCE_CPU_KERNELS=0."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def kernel_cache_dir() -> Path:
    """Where compiled kernels live (one subfolder per source + torch version)."""
    root = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "cadence", "kernels")
    return Path(root)


BASE_CFLAGS = ("-O3", "-fopenmp")


def build_kernels(tier: Tier) -> ModuleType:
    """Compile (or load from the cache) the kernels of `tier`; raises on any build failure."""
    from torch.utils import cpp_extension

    sources = {path.relative_to(KERNEL_DIR).as_posix(): path.read_bytes() for path in kernel_sources()}
    cflags = [*BASE_CFLAGS, *tier.cflags]
    # The torch install's path is in the key too: the build files name its include folders, so
    # two venvs sharing one folder would rebuild everything each time the other one loaded.
    digest = hashlib.sha256(torch.__version__.encode() + b"\0" + " ".join(cflags).encode() + b"\0"
                            + os.path.dirname(torch.__file__).encode())
    for name, text in sources.items():
        digest.update(name.encode() + b"\0" + text)
    key = os.environ.get(ENV_BUILD_KEY) or digest.hexdigest()[:16]
    build_dir = kernel_cache_dir() / f"{tier.name}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # Compile copies kept next to the build: ninja rebuilds when a source path changes, and
    # checkouts in different places (worktrees, CI copies, venvs) share this cache.
    for name, text in sources.items():
        local = build_dir / name
        local.parent.mkdir(parents=True, exist_ok=True)
        if not local.exists() or local.read_bytes() != text:
            staging = local.parent / f".{local.name}.{os.getpid()}"
            staging.write_bytes(text)
            os.replace(staging, local)
    # torch's own build lock is a file that a killed build leaves behind, after which every
    # later process waits on it forever. Builds of cadence take an OS lock first (released when
    # its holder dies, however it dies); whoever holds it may clear torch's stale file.
    with open(build_dir / ".cadence-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        return cpp_extension.load(
            name=f"cadence_cpu_kernels_{tier.name}_{key}",
            sources=[str(build_dir / name) for name in sources if name.endswith(".cpp")],
            build_directory=str(build_dir),
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )


def built_objects(tier: Tier) -> list[Path]:
    """The object files and shared library of `tier`'s cached build (after build_kernels)."""
    module = build_kernels(tier)
    build_dir = Path(module.__file__).parent
    return sorted(build_dir.glob("*.o")) + [Path(module.__file__)]


@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    """The compiled extension of the selected tier, or None (with a logged warning) if there is
    none for this CPU or it cannot be built.

    Cached per process: the build or import happens at most once.
    """
    if not kernels_enabled():
        return None
    try:
        tier = selected_tier()
        if not tier.compiled:
            return None
        return build_kernels(tier)
    except Exception as exc:  # noqa: BLE001 - any build/import failure means "use torch"
        logger.warning("cadence CPU kernels unavailable, using the pure-torch path: %s", exc)
        return None


def cpu_kernels_for(tensor: torch.Tensor) -> ModuleType | None:
    """The kernels if `tensor` is a float32/bfloat16 CPU tensor and they could be loaded."""
    if tensor.device.type != "cpu" or tensor.dtype not in (torch.float32, torch.bfloat16):
        return None
    return load_cpu_kernels()
