"""What a batching policy is: given a StepBuilder, run its stages in some order with some
per-request token rule. Everything else (budget, blocks, preemption) is the builder's."""

from __future__ import annotations

from abc import ABC, abstractmethod

from cadence.core.config import SchedulerConfig
from cadence.core.step_builder import StepBuilder


class Policy(ABC):
    name: str = ""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    @abstractmethod
    def build(self, step: StepBuilder) -> None:
        """Fill one step: call the builder's stages in this policy's order."""
