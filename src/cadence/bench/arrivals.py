"""Send-time schedules for open-loop arrivals (Poisson, gamma); closed-loop concurrency and the
doc-burst script are driven by the runner itself."""

from __future__ import annotations

import numpy as np


def send_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the start at which each of `n` requests is sent; the first at 0.

    Inter-arrival times are gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate for
    any burstiness, burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular.
    """
    if n < 1:
        return []
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0, got rate={rate}, burstiness={burstiness}")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
