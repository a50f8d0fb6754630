"""Think time between a turn's answer and the conversation's next turn: the one draw shared by
the multi-turn load generator (benchmarks/replica_bench.py) and the fleet simulator's synthetic
conversations (sim/conversations.py).

`exponential` (memoryless users, the default) smears a conversation's turn period; `constant`
(a fixed delay before the next turn, as multi-turn load tools commonly send) and a narrow
`uniform` keep it steady, which decides whether an LRU pool keeps one turn period's
prefixes but not two (docs/performance.md#replicas-and-routing).

Every distribution takes exactly one `rng.random()` per draw (none for a zero mean), so one
seed gives the same conversations (starts, system prompts, turn counts, texts) under each
and only the think times differ.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

THINK_DISTS = ("exponential", "constant", "uniform")


def add_think_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        mean_flag: str = "--think-s") -> None:
    """--think-dist and --think-spread, as every multi-turn CLI takes them (the mean comes
    from `mean_flag`)."""
    parser.add_argument("--think-dist", choices=THINK_DISTS, default="exponential",
                        help=f"think times: exponential (default), constant ({mean_flag} every "
                             "time), or uniform")
    parser.add_argument("--think-spread", type=float, default=0.25,
                        help=f"--think-dist uniform: over {mean_flag} x [1 - this, 1 + this]")


@dataclass(frozen=True)
class ThinkTime:
    dist: str = "exponential"
    mean_s: float = 0.3
    spread: float = 0.25  # uniform: over mean_s * [1 - spread, 1 + spread]

    def __post_init__(self) -> None:
        if self.dist not in THINK_DISTS:
            raise ValueError(f"think-time distribution {self.dist!r}: one of {THINK_DISTS}")
        if self.mean_s < 0 or not 0 <= self.spread <= 1:
            raise ValueError("think time: mean_s >= 0 and 0 <= spread <= 1")

    def draw(self, rng: random.Random) -> float:
        if self.mean_s == 0:
            return 0.0  # no draw (as the simulator's conversations always did)
        u = rng.random()  # one draw whatever the distribution (see the module's docstring)
        if self.dist == "exponential":
            # random.expovariate's own formula, so R's seeds keep their think times.
            return -math.log(1.0 - u) / (1.0 / self.mean_s)
        if self.dist == "uniform":
            return self.mean_s * (1.0 - self.spread + 2.0 * self.spread * u)
        return self.mean_s
