"""Decision layer: requests, block pool, prefix cache, scheduler, policies. Pure Python, no torch."""

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.plan import SampledToken, ScheduledChunk, StepOutput, StepPlan
from cadence.core.request import Request, RequestStatus
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.core.scheduler_types import RequestUpdate, SchedulerStats

__all__ = [
    "CacheConfig",
    "Request",
    "RequestStatus",
    "RequestUpdate",
    "SampledToken",
    "SamplingParams",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "StepOutput",
    "StepPlan",
]
