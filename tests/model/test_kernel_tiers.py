"""Kernel tiers: the CPU's features pick the best tier, CADENCE_ISA forces a lower one, `--dtype
auto` follows native bf16, and each tier's build holds no instruction beyond its tier (a build
cached on an AVX-512 machine must run on an AVX2 one: the cache folder is keyed by tier and the
AVX2 objects carry no AVX-512 instruction)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from cadence.model.kernels import isa
from cadence.model.kernels.cpu_ops import built_objects
from cadence.model.loader import resolve_dtype

ZEN3 = frozenset({"avx", "avx2", "fma", "f16c", "sse4_2"})
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_best_tier_follows_the_features():
    assert isa.best_tier(ZEN4).name == "avx512bf16"
    assert isa.best_tier(SKYLAKE_X).name == "avx512"
    assert isa.best_tier(ZEN3).name == "avx2"
    assert isa.best_tier(frozenset({"sse2", "avx"})).name == "torch"
    assert isa.best_tier(frozenset()).name == "torch"  # ARM and others: the pure-torch path
    assert all(t.native_bf16 == (t.name == "avx512bf16") for t in isa.TIERS)


def test_tier_flags_are_explicit_never_native():
    for tier in isa.TIERS:
        assert not any("native" in flag for flag in tier.cflags), tier
    avx2 = isa.tier_by_name("avx2")
    assert not any(flag.startswith("-mavx512") for flag in avx2.cflags)
    with pytest.raises(ValueError, match="unknown kernel tier"):
        isa.tier_by_name("sse9")


def test_forced_tier(monkeypatch):
    isa.selected_tier.cache_clear()
    try:
        monkeypatch.setenv(isa.ENV_ISA, "torch")
        assert isa.selected_tier().name == "torch" and not isa.native_bf16()
        isa.selected_tier.cache_clear()
        monkeypatch.setattr(isa, "cpu_features", lambda: ZEN3)
        monkeypatch.setenv(isa.ENV_ISA, "avx512bf16")
        with pytest.raises(RuntimeError, match="avx512_bf16"):
            isa.selected_tier()
        isa.selected_tier.cache_clear()
        monkeypatch.setattr(isa, "cpu_features", lambda: ZEN4)
        monkeypatch.setenv(isa.ENV_ISA, "avx2")
        assert isa.selected_tier().name == "avx2"
        # The dtype follows the tier that runs: a forced AVX2 tier computes in float32.
        assert resolve_dtype("auto", "cpu") == torch.float32
        isa.selected_tier.cache_clear()
        monkeypatch.delenv(isa.ENV_ISA)
        assert isa.selected_tier().name == "avx512bf16"
        assert resolve_dtype("auto", "cpu") == torch.bfloat16
        assert resolve_dtype("auto", "cuda") == torch.bfloat16
        assert "avx512bf16" in isa.describe()
    finally:
        isa.selected_tier.cache_clear()


# Register names and mnemonics that only AVX-512 (and its BF16/VNNI extensions) have.
AVX512_ANY = re.compile(r"%zmm|%k[0-7]\b|\{%k|vdpbf16ps|vcvtne2?ps2bf16|vpdpbusd|vpdpwssd")
BF16_VNNI = re.compile(r"vdpbf16ps|vcvtne2?ps2bf16|vpdpbusds?\b|vpdpwssds?\b")


def forbidden_for(tier: isa.Tier) -> re.Pattern | None:
    if tier.name == "avx2":
        return AVX512_ANY
    if tier.name == "avx512":
        return BF16_VNNI
    return None


def tiers_to_check() -> list[isa.Tier]:
    """The AVX2 tier and the best one this CPU runs (others: CADENCE_TEST_ALL_TIERS=1 compiles
    them too, a few minutes each, without loading them)."""
    have = isa.cpu_features()
    names = {"avx2", isa.best_tier().name}
    if os.environ.get("CADENCE_TEST_ALL_TIERS") == "1":
        names |= {"avx512", "avx512bf16"}
    return [t for t in isa.TIERS if t.name in names and t.compiled and (t.features <= have or
                                                                         os.environ.get("CADENCE_TEST_ALL_TIERS") == "1")]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
@pytest.mark.skipif(not isa.best_tier().compiled, reason="this CPU has no AVX2: no compiled tier runs here")
@pytest.mark.timeout(3600)  # compiling another tier takes minutes on 2 busy cores
@pytest.mark.parametrize("tier_name", ["avx2", "avx512", "avx512bf16"])
def test_tier_objects_hold_no_instruction_beyond_the_tier(tier_name):
    tier = isa.tier_by_name(tier_name)
    if tier not in tiers_to_check():
        missing = ", ".join(sorted(tier.features - isa.cpu_features())) or "nothing"
        pytest.skip(f"tier {tier_name} is neither AVX2 nor this CPU's best (missing: {missing}); "
                    "CADENCE_TEST_ALL_TIERS=1 compiles it anyway")
    if tier.features <= isa.cpu_features():
        objects = built_objects(tier)
    else:
        # Compile without importing (the import could run the tier's instructions): a child
        # process builds; its exit status does not matter, its objects do.
        code = ("from cadence.model.kernels.cpu_ops import build_kernels; "
                f"from cadence.model.kernels.isa import tier_by_name; build_kernels(tier_by_name({tier_name!r}))")
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=1800)
        from cadence.model.kernels.cpu_ops import kernel_cache_dir
        folders = sorted(kernel_cache_dir().glob(f"{tier_name}-*"), key=lambda p: p.stat().st_mtime)
        assert folders, f"no build folder for {tier_name}"
        objects = sorted(folders[-1].glob("*.o"))
    assert objects, "the build left no objects"
    pattern = forbidden_for(tier)
    if tier.name == "avx2":
        assert any(o.name.startswith("decode_stack_f32") for o in objects)
    for obj in objects:
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True,
                                 text=True, check=True).stdout
        if pattern is not None:
            bad = pattern.search(listing)
            assert bad is None, f"{obj.name} ({tier_name} tier) holds {bad.group(0)!r}"


@pytest.mark.slow
@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= isa.cpu_features(), reason="this CPU lacks AVX2/FMA/F16C")
def test_forced_avx2_tier_runs_in_a_fresh_process():
    code = ("from cadence.model.kernels.cpu_ops import load_cpu_kernels; import torch; "
            "from cadence.model.loader import resolve_dtype; k = load_cpu_kernels(); "
            "print(k.kernel_tier(), k.has_avx512bf16(), resolve_dtype('auto'))")
    env = {**os.environ, isa.ENV_ISA: "avx2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["avx2", "False", "torch.float32"]


@pytest.mark.slow
@pytest.mark.skipif(not isa.best_tier().compiled, reason="this CPU has no AVX2: no compiled tier runs here")
def test_a_killed_build_does_not_block_later_loads():
    # torch's build lock file, as a build killed mid-way leaves it: the next load must go on.
    module_dir = built_objects(isa.selected_tier())[-1].parent
    (module_dir / "lock").touch()
    code = "from cadence.model.kernels.cpu_ops import load_cpu_kernels; print(load_cpu_kernels().kernel_tier())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == isa.selected_tier().name, out.stderr[-2000:]
    assert not (module_dir / "lock").exists()


def test_int8_dot_peak_is_a_physical_rate():
    """The int8 dot-product micro kernel (benchmarks' FLOP floor of quantized GEMMs) runs its
    instructions: a rate above zero and below what the tier's registers can do at 2 dot
    instructions per cycle and 6 GHz on every thread (a loop the compiler had shortened would
    report more)."""
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("no compiled kernels")
    register_bytes = 64 if kernels.kernel_tier().startswith("avx512") else 32
    bound = torch.get_num_threads() * register_bytes * 2 * 2 * 6e9
    rate = kernels.int8_dot_peak(200_000)
    assert 1e9 < rate < bound
