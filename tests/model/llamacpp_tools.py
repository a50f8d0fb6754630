"""llama.cpp's own tools for the dev-only tests that hold cadence to llama.cpp's route
(convert_hf_to_gguf.py, llama-quantize, llama-completion), from the cache outside the repo
(CADENCE_LLAMACPP_CACHE; benchmarks/llamacpp_peer.py --build). Tests using them carry
`requires_llamacpp`, so they skip where that cache is absent (CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.bench_modules import load_benchmark

hf_shapes = load_benchmark("hf_shapes")
CACHE = hf_shapes.llamacpp_cache()
COMPLETION = CACHE / "build" / "bin" / "llama-completion"
requires_llamacpp = pytest.mark.skipif(
    hf_shapes.converter_script(CACHE) is None or hf_shapes.quantize_binary(CACHE) is None
    or not os.access(COMPLETION, os.X_OK),
    reason=f"llama.cpp is not in {CACHE} (set CADENCE_LLAMACPP_CACHE; benchmarks/llamacpp_peer.py --build)")


def convert_f32(hf_folder: Path, out: Path) -> None:
    """An HF folder -> an F32 GGUF by llama.cpp's converter, run with its own gguf-py (the
    venv's may lack archs the conversion package names)."""
    cmd = [sys.executable, "-c", hf_shapes._CONVERT_RUNNER, str(hf_shapes.converter_script(CACHE)),
           str(hf_folder), "--outfile", str(out), "--outtype", "f32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def quantize(f32: Path, out: Path, file_type: str) -> None:
    """llama-quantize f32 -> out in `file_type` (Q8_0, Q3_K_M, ...), 2 threads."""
    hf_shapes.quantize(hf_shapes.quantize_binary(CACHE), f32, out, file_type, 2)


def completion_text(path: Path, prompt: str, steps: int) -> str:
    """llama-completion's greedy continuation of `prompt` (`steps` tokens, 2 threads), as printed."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(COMPLETION.parent))
    run = subprocess.run([str(COMPLETION), "-m", str(path), "-p", prompt, "-n", str(steps), "--temp", "0",
                          "-no-cnv", "--no-display-prompt", "-t", "2"],
                         capture_output=True, env=env, timeout=300, check=True)
    return run.stdout.decode(errors="replace")
