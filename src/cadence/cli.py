"""The `cadence` command. Each package registers its own subcommand (see docs/INTERFACES.md)."""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, what it adds). A module that fails to import is reported, not hidden, when its
# subcommand is asked for.
_SUBCOMMAND_MODULES = (
    "cadence.engine.cli_generate",
    "cadence.server.cli_serve",
    "cadence.bench.cli",
    "cadence.sim.cli",
    "cadence.diagnose.cli",
    "cadence.disagg.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cadence", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(name):
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
