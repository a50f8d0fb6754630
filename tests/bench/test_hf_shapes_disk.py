"""benchmarks/hf_shapes.py's disk handling, without llama.cpp: a build that the disk cannot hold
is refused before it writes anything, and a failed step leaves no partial file behind (the
converter's output is as large as the checkpoint: 15 GiB for the 8B shape)."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from tests.bench.bench_modules import load_benchmark

GIB = 2**30


hf_shapes = load_benchmark("hf_shapes", as_name="hf_shapes_disk")


def _fake_llamacpp(root: Path) -> Path:
    """A cache folder with the two files build() looks for (never run in these tests)."""
    script = root / "llama_cpp_python-0.0.0" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    script.parent.mkdir(parents=True)
    script.write_text("raise SystemExit(1)\n")
    binary = root / "build" / "bin" / "llama-quantize"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    return root


def test_peak_disk_is_checkpoint_and_bf16_gguf_side_by_side():
    ckpt = hf_shapes.checkpoint_bytes(hf_shapes.SHAPES["llama-3.1-8b"])
    assert 14.5 * GIB < ckpt < 15.5 * GIB  # 8.0e9 parameters in bf16
    needed = hf_shapes.disk_needed("llama-3.1-8b", ["Q4_K_M", "Q8_0"])
    assert needed == 2 * ckpt  # the converter's peak: checkpoint + bf16 GGUF
    # Once the bf16 GGUF is there (a resumed build), only it and the outputs.
    resumed = hf_shapes.disk_needed("llama-3.1-8b", ["Q4_K_M", "Q8_0"], have_bf16=True)
    assert ckpt < resumed < 2 * ckpt


def test_build_refuses_a_disk_too_small_before_writing(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(hf_shapes.shutil, "disk_usage", lambda _: usage(100 * GIB, 99 * GIB, GIB))
    out = tmp_path / "out"
    with pytest.raises(OSError, match="needs about"):
        hf_shapes.build("qwen3-4b", ["Q4_K_M"], out, cache=_fake_llamacpp(tmp_path / "llamacpp"))
    assert list(out.iterdir()) == []


def test_failed_conversion_leaves_no_partial_file(tmp_path, monkeypatch):
    def failing_convert(folder, out, script, gguf_py):
        out.write_bytes(b"half a GGUF")  # what a converter killed mid-write leaves
        raise RuntimeError("convert_hf_to_gguf failed (1)")

    monkeypatch.setattr(hf_shapes, "convert", failing_convert)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="convert_hf_to_gguf failed"):
        hf_shapes.build("tiny-llama", ["Q4_K_M"], out, shard_gib=0.01,
                        cache=_fake_llamacpp(tmp_path / "llamacpp"))
    assert list(out.iterdir()) == []  # neither the checkpoint nor the partial GGUF
    assert shutil.disk_usage(tmp_path).free > 0
