"""llama.cpp as the peer of perf_bench: its `llama-bench` on the same GGUF, same threads.

llama.cpp is built from the `llama-cpp-python` sdist on PyPI (it vendors llama.cpp), once, into a
cache folder outside the repository (``$CADENCE_LLAMACPP_CACHE`` or ``~/.cache/cadence/llamacpp``),
one build per CPU (the folder is keyed by the CPU's model name and flags: llama.cpp's native
build is only valid on the CPU that built it). Nothing of it enters the repository. The F16 file
is made from the shipped Q4_1 GGUF with llama-quantize (--allow-requantize).

    .venv/bin/python benchmarks/llamacpp_peer.py --build      # ~10-25 min on 2 cores, once
    .venv/bin/python benchmarks/llamacpp_peer.py              # pp512 / tg128, Q4_1 and F16
    .venv/bin/python benchmarks/llamacpp_peer.py --build-avx2 # an AVX2-only llama-bench as well
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python sdist that vendors llama.cpp


def cache_root() -> Path:
    return Path(os.environ.get("CADENCE_LLAMACPP_CACHE") or Path.home() / ".cache" / "cadence" / "llamacpp")


def cpu_key() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        info = ""
    model = next((line for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return hashlib.sha256((model + flags).encode()).hexdigest()[:12]


def source_dir() -> Path:
    return cache_root() / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def build_dir() -> Path:
    return cache_root() / f"build-{VERSION}-{cpu_key()}"


# llama.cpp's CPU backend limited to AVX2 (+ FMA, F16C, BMI2; no AVX-512): the peer of cadence's
# forced AVX2 tier on a CPU that has AVX-512, as a Zen 3 host would run both (build_avx2()).
AVX2_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF")


def avx2_build_dir() -> Path:
    return cache_root() / f"build-{VERSION}-avx2"


def binary(name: str, variant: str = "native") -> Path | None:
    """A built llama.cpp tool: the native build, or (variant 'avx2') the AVX2-only one."""
    paths = ((avx2_build_dir() / "bin" / name,) if variant == "avx2"
             else (build_dir() / "bin" / name, source_dir() / "build" / "bin" / name))
    for path in paths:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def build_avx2() -> Path:
    """llama-bench of an AVX2-only build (sources from build(); ~10-20 min on 2 cores)."""
    if not source_dir().is_dir():
        build()
    subprocess.run(["cmake", "-S", str(source_dir()), "-B", str(avx2_build_dir()), "-DCMAKE_BUILD_TYPE=Release",
                    *AVX2_FLAGS, "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(avx2_build_dir()), "--target", "llama-bench",
                    f"-j{os.cpu_count() or 2}"], check=True)
    return avx2_build_dir()


def build() -> Path:
    """Download the sdist and build llama.cpp's tools that the benchmarks run (raises on failure)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if not source_dir().is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(root)], check=True)
        with tarfile.open(next(iter(glob.glob(str(root / f"llama_cpp_python-{VERSION}.tar.gz"))))) as tar:
            tar.extractall(root, filter="data")
    subprocess.run(["cmake", "-S", str(source_dir()), "-B", str(build_dir()), "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
    # llama-perplexity, llama-tokenize and llama-completion: benchmarks/perplexity_vs_llamacpp.py.
    subprocess.run(["cmake", "--build", str(build_dir()), "--target", "llama-bench", "llama-quantize",
                    "llama-perplexity", "llama-tokenize", "llama-completion",
                    f"-j{os.cpu_count() or 2}"], check=True)
    return build_dir()


def f16_file(q_path: str) -> str | None:
    """An F16 GGUF made from the quantized one (cached next to the build), or None."""
    out = cache_root() / (Path(q_path).stem + ".F16.gguf")
    if out.is_file():
        return str(out)
    quantize = binary("llama-quantize")
    if quantize is None:
        return None
    result = subprocess.run([str(quantize), "--allow-requantize", q_path, str(out), "F16"],
                            capture_output=True, text=True)
    return str(out) if result.returncode == 0 and out.is_file() else None


def llama_bench(gguf: str, threads: int, tests: str = "pp512,tg128", repetitions: int = 3,
                depths: tuple[int, ...] = (0,), variant: str = "native") -> dict[str, float] | str:
    """{'pp512': tok/s, 'tg128': tok/s} from llama-bench, or a message saying why not.

    `depths`: llama-bench's -d, each test after that many context tokens (computed untimed);
    a depth D > 0 keys its result 'tg128@d512'. `variant`: 'avx2' runs the AVX2-only build."""
    bench = binary("llama-bench", variant)
    if bench is None:
        flag = "--build-avx2" if variant == "avx2" else "--build"
        return f"llama.cpp {variant} not built (run benchmarks/llamacpp_peer.py {flag}; cache {cache_root()})"
    args = [str(bench), "-m", gguf, "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    for test in tests.split(","):
        kind, n = test[:2], test[2:]
        args += ["-p", n, "-n", "0"] if kind == "pp" else ["-p", "0", "-n", n]
    if tuple(depths) != (0,):
        args += ["-d", ",".join(str(d) for d in depths)]
    # llama.cpp's own environment, not cadence's: `import cadence` sets OMP_WAIT_POLICY=PASSIVE
    # (cadence/__init__.py), and llama.cpp's OpenMP threads that sleep at each of a token's
    # ~hundreds of barriers decode 2.5x slower (tg128 Q4_1 on 2 Zen 4 cores: 47-49 tok/s with it,
    # 115-124 without). Earlier runs of this benchmark carried that handicap.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")}
    result = subprocess.run(args, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return f"llama-bench failed: {result.stderr.strip()[-300:]}"
    out = {}
    for row in json.loads(result.stdout):
        n_prompt, n_gen = row.get("n_prompt", 0), row.get("n_gen", 0)
        key = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        if row.get("n_depth", 0):
            key += f"@d{row['n_depth']}"
        out[key] = float(row["avg_ts"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build llama.cpp into the cache first")
    parser.add_argument("--build-avx2", action="store_true",
                        help="also build an AVX2-only llama-bench (the peer of CADENCE_ISA=avx2)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.build:
        build()
    if args.build_avx2:
        build_avx2()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from cadence.model.loader import default_model_path

    q = default_model_path()
    for name, path in (("Q4_1", q), ("F16", f16_file(q))):
        if path is None:
            print(f"llama.cpp {name}: no file (llama-quantize not built)")
            continue
        print(f"llama.cpp {name}: {llama_bench(path, args.threads)}")


if __name__ == "__main__":
    main()
