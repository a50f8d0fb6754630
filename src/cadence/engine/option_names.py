"""One user-facing name per config field, shared by `cadence serve`, `cadence generate` and
`LLM(...)`: a field's `metadata["name"]` when it has one (vLLM's spelling where the field's own
name differs, e.g. SchedulerConfig.scheduling -> scheduling_policy), its field name otherwise.
Flags are the name with dashes (`--scheduling-policy`)."""

from __future__ import annotations

import dataclasses

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.engine.config import EngineConfig

# Nested configs and internals that are not options of their own.
_NOT_OPTIONS = {(EngineConfig, "scheduler"), (EngineConfig, "cache"), (EngineConfig, "model")}


def option_name(field: dataclasses.Field) -> str:
    return field.metadata.get("name", field.name)


def flag_of(field: dataclasses.Field) -> str:
    return "--" + option_name(field).replace("_", "-")


def user_option_fields() -> dict[str, tuple[type, str]]:
    """user name -> (config class, field name) over the three engine configs."""
    out = {}
    for cls in (SchedulerConfig, CacheConfig, EngineConfig):
        for f in dataclasses.fields(cls):
            if (cls, f.name) not in _NOT_OPTIONS:
                out[option_name(f)] = (cls, f.name)
    return out
