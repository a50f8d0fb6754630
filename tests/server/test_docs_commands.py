"""Every command in README.md and docs/*.md's bash blocks is one this checkout has, and the
cheap ones run:

- run for real: the README's quick start (serve, curl, the openai and offline snippets:
  test_readme_quickstart.py) and `cadence generate` lines (here, on the tiny model);
- parsed only, because they serve until stopped, need several machines or run for minutes:
  `cadence serve / router / bench / sweep` lines with cadence's own parser (flags, choices,
  value types), benchmark scripts and `python -m` modules with their own argparse parser
  (each run up to its parsing, then stopped: docs_parse_only.py), `ray` lines with Ray's
  CLI; `pip install` names a package (or an extra pyproject.toml declares), `make` a target
  the Makefile has, a `python -c` line compiles.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
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


def _python_programs() -> list[list[str]]:
    """["path", FILE, flags...] / ["module", NAME, flags...] of the pages' python lines."""
    out = []
    for _, command in COMMANDS:
        words = shlex.split(command)
        if words[0] != ".venv/bin/python" or words[1] == "-c":
            continue
        out.append(["module", *words[2:]] if words[1] == "-m" else ["path", *words[1:]])
    return out


def test_scripts_and_modules_parse_their_documented_flags():
    programs = _python_programs()
    assert len(programs) > 10
    out = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name(
        "docs_parse_only.py")), json.dumps(programs)], capture_output=True, text=True,
        timeout=300, cwd=ROOT)
    results = json.loads(out.stdout.strip().splitlines()[-1])
    wrong = {command: result for command, result in results.items() if result != "ok"}
    assert not wrong and len(results) == len({" ".join(p) for p in programs}), (wrong,
                                                                             out.stderr[-2000:])


def test_generate_lines_run_for_real(tiny_llama_dir):
    lines = [shlex.split(c) for _, c in COMMANDS if c.startswith(".venv/bin/cadence generate")]
    assert lines
    for words in lines:
        # The page's flags, on the tiny model (its --model wins: the last flag given).
        out = subprocess.run([sys.executable, "-m", "cadence.cli", *words[1:], "--model",
                              tiny_llama_dir, "--dtype", "float32", "--no-startup-profile"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
        assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]


def test_links_to_performance_sections_resolve():
    """Pages link to their numbers in docs/performance.md: every #section they name exists."""
    headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", (ROOT / "docs" / "performance.md").read_text(),
                                    re.M)}
    links = [(page.name, anchor) for page in PAGES
             for anchor in re.findall(r"performance\.md#([\w-]+)", page.read_text())]
    assert links and all(anchor in headings for _, anchor in links), (links, headings)
