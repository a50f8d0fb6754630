"""Command-line flags generated from the frozen config dataclasses (help text lives there).

`add_config_args(parser, SchedulerConfig)` adds `--max-num-batched-tokens` etc. (vLLM's flag
spellings: the field name with dashes); `config_from_args(args, SchedulerConfig)` builds the
config back. Booleans get `--flag / --no-flag`. Fields listed in `skip` are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from cadence.engine.option_names import flag_of


def _scalar_type(hint: Any) -> Any:
    """int for `int`, `int | None`, `Optional[int]`; the hint itself otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def add_config_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    skip: tuple[str, ...] = (),
) -> None:
    """Add one flag per scalar field of dataclass `cls`; defaults stay None (= the config's)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = _scalar_type(hints[f.name])
        if kind not in (int, float, str, bool):
            continue  # nested configs are added separately
        flag = flag_of(f)  # one user-facing name per concept (option_names.py)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        help_text = f"{help_text} (default: {default})" if help_text else f"default: {default}"
        if kind is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag, dest=f.name, type=kind, default=None, help=help_text,
                choices=f.metadata.get("choices"),
            )


def config_from_args(args: argparse.Namespace, cls: type, **overrides: Any) -> Any:
    """Build `cls` from the flags that were given (others keep the dataclass defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    given.update(overrides)
    return cls(**given)
