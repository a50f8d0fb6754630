"""Every command in README.md and docs/*.md's bash blocks is one this checkout has: `cadence`
lines parse with the real argument parser (flags, choices, value types), scripts and modules
exist, make targets are in the Makefile. (The README's quick start is run for real in
test_readme_quickstart.py; benchmarks are too slow to run here.)"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shlex
import tomllib

import pytest

from cadence.cli import build_parser

ROOT = pathlib.Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for command in block.replace("\\\n", " ").splitlines():
                command = command.split(" #")[0].strip().rstrip("&").strip()
                if command and not command.startswith("#"):
                    out.append((page.name, command))
    return out


COMMANDS = _commands()


def test_the_pages_have_commands():
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("page, command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_command_exists_and_parses(page, command):
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    if words[0] == ".venv/bin/cadence":
        build_parser().parse_args(words[1:])  # SystemExit (exit 2) on an unknown flag
    elif words[0] in (".venv/bin/pip", "pip"):
        assert words[1] == "install", command  # installs a package from PyPI by name
        for extra in re.findall(r"^\.\[([\w,-]+)\]$", words[-1]):  # this checkout's extras
            declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
                "optional-dependencies"]
            assert set(extra.split(",")) <= set(declared), command
    elif words[0] == ".venv/bin/python":
        if words[1] == "-c":
            compile(words[2], command, "exec")  # a one-line program: it must at least parse
        elif words[1] == "-m":
            assert importlib.util.find_spec(words[2]) is not None, command
        else:
            assert (ROOT / words[1]).is_file(), command
    elif words[0] == "make":
        assert re.search(rf"^{re.escape(words[1])}:", (ROOT / "Makefile").read_text(), re.M)
    elif words[0] == ".venv/bin/ray":
        scripts = pytest.importorskip("ray.scripts.scripts")
        # Ray's own (click) parser: the subcommand exists and takes these options.
        scripts.cli.commands[words[1]].make_context(words[1], words[2:])
    elif words[0] == "curl":
        pass  # run by test_readme_quickstart.py
    else:
        pytest.fail(f"{page}: a command this test does not know how to check: {command}")
