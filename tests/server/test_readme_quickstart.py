"""The README fits on a screen and its quick start runs: the serve command, the curl call, the
openai-client snippet and the offline snippet, taken from README.md as written (pointed at the
tiny model and a free port instead of the default model on :8000, to stay fast)."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from server_harness import start_server, tiny_model_args

README = pathlib.Path(__file__).parents[2] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_fits_on_a_screen_and_starts_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) < 120
    first = _blocks("bash")[0].splitlines()
    assert first[0].startswith("make serve") and first[1].startswith("make test")
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (README.parent / link).exists(), link


@pytest.fixture(scope="module")
def quickstart_server(tiny_llama_dir, tmp_path_factory):
    serve_line = next(ln for ln in _blocks("bash")[1].splitlines() if " serve" in ln)
    args = shlex.split(serve_line.split("#")[0].replace("&", ""))
    assert args[:2] == [".venv/bin/cadence", "serve"]
    # The README's flags but its port (the harness picks a free one), then the tiny model.
    flags = args[2:]
    if "--port" in flags:
        at = flags.index("--port")
        flags = flags[:at] + flags[at + 2:]
    server = start_server(str(tmp_path_factory.mktemp("server")), *flags,
                          *tiny_model_args(tiny_llama_dir))
    yield server
    server.stop()


def test_quickstart_curl(quickstart_server):
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    block = _blocks("bash")[1]
    command = block[block.index("curl"):].replace("\\\n", " ")
    command = command.replace("http://127.0.0.1:8000", quickstart_server.base_url)
    out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and '"text"' in out.stdout, out.stdout + out.stderr


def test_quickstart_openai_snippet(quickstart_server):
    snippet = _blocks("python")[0].replace("http://127.0.0.1:8000", quickstart_server.base_url)
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_quickstart_offline_snippet(tiny_llama_dir):
    snippet = _blocks("python")[1].replace("LLM(", f"LLM(model={tiny_llama_dir!r}, ", 1)
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert out.returncode == 0, out.stderr
    assert "gpu_memory_utilization" in out.stderr  # the one warning line, as the README says
