"""Batching policies: an ordering of the step's stages plus a per-request token cap."""

from cadence.core.config import SchedulerConfig
from cadence.core.policies.base import Policy
from cadence.core.policies.chunked import ChunkedPolicy
from cadence.core.policies.eager import EagerPolicy
from cadence.core.policies.slo import SLOPolicy

_POLICIES: dict[str, type[Policy]] = {
    "eager": EagerPolicy,
    "chunked": ChunkedPolicy,
    "slo": SLOPolicy,
    # Colocated steps of slo; the engine (and the simulator) split the cores beside them.
    "adaptive": SLOPolicy,
}


def make_policy(config: SchedulerConfig) -> Policy:
    """The policy named by `config.policy`."""
    try:
        cls = _POLICIES[config.policy]
    except KeyError:
        raise ValueError(f"unknown policy {config.policy!r}; expected one of {sorted(_POLICIES)}")
    return cls(config)


__all__ = ["ChunkedPolicy", "EagerPolicy", "Policy", "SLOPolicy", "make_policy"]
