"""The simulator: the real cadence.core scheduler on a virtual clock, with step costs from a
hardware roofline or a trace fit instead of a model. Torch-free.

    from cadence.sim import doc_burst, simulate, RooflineCostModel, SMOLLM2_135M, get_profile
    result = simulate(doc_burst(), SchedulerConfig(policy="slo"),
                      RooflineCostModel(SMOLLM2_135M, get_profile("cpu-2core")))
"""

from cadence.sim.clock import VirtualClock
from cadence.sim.cost_model import CostModel, LinearCostModel, RooflineCostModel
from cadence.sim.hardware import PROFILES, HardwareProfile, get_profile
from cadence.sim.metrics import SimSummary, summarize
from cadence.sim.model_shape import SMOLLM2_135M, ModelShape
from cadence.sim.simulator import SimResult, SimStep, simulate
from cadence.sim.workload import SimRequestSpec, Workload, doc_burst

__all__ = [
    "PROFILES",
    "SMOLLM2_135M",
    "CostModel",
    "HardwareProfile",
    "LinearCostModel",
    "ModelShape",
    "RooflineCostModel",
    "SimRequestSpec",
    "SimResult",
    "SimStep",
    "SimSummary",
    "VirtualClock",
    "Workload",
    "doc_burst",
    "get_profile",
    "simulate",
    "summarize",
]
