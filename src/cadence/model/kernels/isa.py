"""Instruction-set tiers of the CPU kernels: which the CPU supports, which one runs.

Each tier is one build of the kernel sources with its own explicit compiler flags (never
``-march=native``: a cached or shipped build must run on any CPU that has the tier's features),
cached in its own folder. At run time the best tier the CPU supports is loaded; the environment
variable ``CADENCE_ISA`` forces a lower one (so the AVX2 tier is tested on AVX-512 machines too):

  avx512bf16  AVX-512 F/BW/VL/DQ + BF16 + VNNI: bf16 compute on packed bf16 weights (Zen 4,
              Sapphire Rapids). The only tier with native bf16 dot products.
  avx512      AVX-512 F/BW/VL/DQ: float32 compute (Skylake-X, Ice Lake).
  avx2        AVX2 + FMA + F16C: float32 compute on weights stored compressed (bf16 or int8)
              and widened in registers (Zen 2/3, Haswell and later client chips).
  torch       no compiled kernels: the pure-torch path (ARM, old x86, kernels switched off).

Features come from /proc/cpuinfo (Linux) where it is readable, else from torch's own CPU
capability probe.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

ENV_ISA = "CADENCE_ISA"

# Feature flags as /proc/cpuinfo names them.
_AVX2 = frozenset({"avx", "avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
_AVX512BF16 = _AVX512 | {"avx512_bf16", "avx512_vnni"}


@dataclass(frozen=True)
class Tier:
    """One build of the kernels: its name, the CPU features it needs and its compiler flags."""

    name: str
    features: frozenset[str]
    cflags: tuple[str, ...]
    native_bf16: bool  # bf16 dot products in hardware: bf16 compute pays only here

    @property
    def compiled(self) -> bool:
        return bool(self.cflags)


# Best first. Explicit flags only: -mtune=generic keeps scheduling neutral across vendors.
TIERS: tuple[Tier, ...] = (
    Tier("avx512bf16", _AVX512BF16,
         ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
          "-mavx512dq", "-mavx512bf16", "-mavx512vnni", "-mtune=generic"), True),
    Tier("avx512", _AVX512,
         ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
          "-mavx512dq", "-mtune=generic"), False),
    Tier("avx2", _AVX2, ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mtune=generic"), False),
    Tier("torch", frozenset(), (), False),
)
TIER_NAMES = tuple(t.name for t in TIERS)


def tier_by_name(name: str) -> Tier:
    for tier in TIERS:
        if tier.name == name:
            return tier
    raise ValueError(f"unknown kernel tier {name!r}; use one of {', '.join(TIER_NAMES)}")


def _torch_capability_features() -> frozenset[str]:
    """Fallback when /proc/cpuinfo is not readable: torch's probe (DEFAULT, AVX2, AVX512)."""
    try:
        import torch

        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - no probe means no features we can rely on
        return frozenset()
    if cap.startswith("AVX512"):
        return _AVX512
    if cap == "AVX2":
        return _AVX2
    return frozenset()


@functools.cache
def cpu_features() -> frozenset[str]:
    """The CPU's feature flags relevant to the tiers (empty on non-x86)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return frozenset()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return _torch_capability_features()


def best_tier(features: frozenset[str] | None = None) -> Tier:
    """The best tier whose features the CPU has (torch when none)."""
    have = cpu_features() if features is None else features
    for tier in TIERS:
        if tier.features <= have:
            return tier
    return TIERS[-1]


@functools.cache
def selected_tier() -> Tier:
    """The tier that runs: the best one, or CADENCE_ISA when it names one the CPU supports.

    A forced tier above what the CPU has is refused with an error (it would die on an illegal
    instruction); CADENCE_CPU_KERNELS=0 still switches the compiled kernels off entirely.
    """
    best = best_tier()
    forced = os.environ.get(ENV_ISA, "").strip().lower()
    if not forced or forced == "auto":
        return best
    tier = tier_by_name(forced)
    if not tier.features <= cpu_features():
        missing = ", ".join(sorted(tier.features - cpu_features()))
        raise RuntimeError(f"{ENV_ISA}={forced}: this CPU lacks {missing} (best tier here: {best.name})")
    return tier


def native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (what `--dtype auto` picks bf16 for on CPU).

    Follows CADENCE_ISA, so a forced AVX2 tier also gets the AVX2 tier's dtype."""
    return selected_tier().native_bf16


def describe() -> str:
    """One line for startup logs: features found and the tier that runs."""
    have = cpu_features()
    shown = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in have]
    return f"cpu features: {' '.join(shown) or 'none of avx2/avx512'}; kernel tier: {selected_tier().name}"
