"""Hardware profiles for the roofline cost model: how fast a machine moves bytes and FLOPs."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareProfile:
    """Sustained (not peak) rates of one device, and the fixed cost of a step."""

    name: str
    memory_bandwidth_bytes_s: float
    gemm_flops_s: float
    # Attention runs below GEMM rate on most kernels; None means the GEMM rate.
    attention_flops_s: float | None = None
    # Framework and launch overhead of one forward (Python, kernel launches), seconds.
    step_overhead_s: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("memory_bandwidth_bytes_s", "gemm_flops_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.attention_flops_s is not None and not self.attention_flops_s > 0:
            raise ValueError(f"attention_flops_s must be > 0, got {self.attention_flops_s!r}")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s!r}")

    @property
    def attention_rate(self) -> float:
        return self.attention_flops_s or self.gemm_flops_s


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            name="cpu-2core",
            memory_bandwidth_bytes_s=44e9,
            gemm_flops_s=380e9,
            step_overhead_s=0.002,
            description="2 CPU cores, bf16: 44 GB/s, 380 GFLOP/s GEMM (this project's "
            "machines); 2 ms of framework overhead per forward is an assumption",
        ),
        HardwareProfile(
            name="h200",
            memory_bandwidth_bytes_s=4.0e12,
            gemm_flops_s=600e12,
            attention_flops_s=300e12,
            step_overhead_s=0.004,
            description="one H200, bf16, illustrative sustained rates (4 TB/s, 600 TFLOP/s); a "
            "135M model there is launch-bound, hence 4 ms of overhead",
        ),
    )
}


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown hardware profile {name!r}; known: {sorted(PROFILES)}") from None
