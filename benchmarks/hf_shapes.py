"""Real model shapes through llama.cpp's own route: random-weight Hugging Face checkpoints with
the configs of Llama-3.2-1B, Qwen3-4B and Llama-3.1-8B (and Qwen3-0.6B with a Llama twin of
its shapes, for benchmarks/reference_logits.py), converted by llama.cpp's
convert_hf_to_gguf.py and quantized by llama-quantize (Q4_K_M, Q8_0).

benchmarks/gguf_shapes.py writes random GGUF blocks directly (fast, no llama.cpp needed); this
route gives files exactly as a user gets them from a published checkpoint: llama.cpp's tensor
types per layer, its metadata (rope scaling factors, Qwen3's q/k norms), its token list. Random
weights are enough for speed; quality is the model-families tests' job.

Memory: the model is never built in memory. Its tensor names and shapes come from the
transformers model class instantiated on the meta device; each tensor is drawn (normal, std
0.02, norms 1), in bf16, and written to a safetensors shard of at most --shard-gib; an 8B
checkpoint (16 GB in bf16) takes ~2 GiB of RAM at a time. The converter writes a bf16 GGUF,
llama-quantize the requested types; the bf16 GGUF and the checkpoint are deleted unless
--keep-intermediate. The tokenizer is SmolLM2's (the default model's, rebuilt from its GGUF):
llama.cpp pads its 49152 tokens to the shape's vocabulary.

Everything is written under --out (default $CADENCE_SHAPES_DIR, else ~/.cache/cadence/shapes),
never in the repository. llama.cpp comes from $CADENCE_LLAMACPP_CACHE (default
~/.cache/cadence/llamacpp): the llama-cpp-python sdist's vendor/llama.cpp for the converter
(its conversion package, and the gguf-py beside it: the venv's gguf 0.19 lacks what this
converter calls, LazyChunkedTensor; --gguf-py venv tries it anyway) and build/bin/llama-quantize.

    CADENCE_LLAMACPP_CACHE=/work/cache/llamacpp .venv/bin/python benchmarks/hf_shapes.py \\
        --shape llama-3.2-1b qwen3-4b --types Q4_K_M Q8_0 --out /work/cache/shapes --check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

GIB = 2**30


@dataclass(frozen=True)
class HFShape:
    """A published model's config (the fields that set its tensor shapes and metadata)."""

    architecture: str  # transformers class
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    tied: bool
    max_positions: int
    rms_norm_eps: float
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)

    def config(self, bos: int, eos: int) -> dict[str, Any]:
        """config.json's contents."""
        out = {"architectures": [self.architecture], "model_type": self.model_type,
               "hidden_size": self.hidden, "intermediate_size": self.intermediate,
               "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
               "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
               "vocab_size": self.vocab, "rope_theta": self.rope_theta,
               "tie_word_embeddings": self.tied, "max_position_embeddings": self.max_positions,
               "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu", "attention_bias": False,
               "mlp_bias": False, "torch_dtype": "bfloat16", "bos_token_id": bos, "eos_token_id": eos}
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out


def _llama3_scaling(factor: float) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


SHAPES = {
    "llama-3.2-1b": HFShape("LlamaForCausalLM", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 500000.0, True,
                            131072, 1e-5, _llama3_scaling(32.0)),
    "qwen3-4b": HFShape("Qwen3ForCausalLM", "qwen3", 2560, 9728, 36, 32, 8, 128, 151936, 1000000.0, True,
                        40960, 1e-6),
    "llama-3.1-8b": HFShape("LlamaForCausalLM", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 500000.0, False,
                            131072, 1e-5, _llama3_scaling(8.0)),
    # Qwen3-0.6B's config, and a Llama with the same tensor shapes (no q/k norms, llama.cpp's
    # permuted q/k and normal rope): small enough for an exact float64 reference of the file
    # (benchmarks/reference_logits.py), the pair isolates what Qwen3 adds.
    "qwen3-0.6b": HFShape("Qwen3ForCausalLM", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 1000000.0, True,
                          40960, 1e-6),
    "llama-qwen3-0.6b-twin": HFShape("LlamaForCausalLM", "llama", 1024, 3072, 28, 16, 8, 128, 151936, 1000000.0,
                                     True, 40960, 1e-6),
    # The test's shape: seconds to build, convert and quantize (rows of 256: the K-quants' block).
    "tiny-llama": HFShape("LlamaForCausalLM", "llama", 256, 512, 2, 4, 2, 64, 49152, 10000.0, True, 2048, 1e-5),
}


def llamacpp_cache() -> Path:
    return Path(os.environ.get("CADENCE_LLAMACPP_CACHE")
                or Path.home() / ".cache" / "cadence" / "llamacpp")


def converter_script(cache: Path) -> Path | None:
    """convert_hf_to_gguf.py of the llama-cpp-python sdist unpacked in the cache, or None."""
    found = sorted(cache.glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1] if found else None


def quantize_binary(cache: Path) -> Path | None:
    path = cache / "build" / "bin" / "llama-quantize"
    return path if path.is_file() else None


def default_out() -> Path:
    return Path(os.environ.get("CADENCE_SHAPES_DIR") or Path.home() / ".cache" / "cadence" / "shapes")


def tensor_shapes(shape: HFShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor the checkpoint holds, from the transformers class built on
    the meta device (no memory), tied heads left out as HF saves them."""
    import torch
    import transformers

    config_cls = transformers.AutoConfig.for_model(shape.model_type).__class__
    cfg = config_cls(**{k: v for k, v in shape.config(0, 0).items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = getattr(transformers, shape.architecture)(cfg)
    out = []
    for name, tensor in model.state_dict().items():
        if shape.tied and name == "lm_head.weight":
            continue
        out.append((name, tuple(tensor.shape)))
    return out


def write_tokenizer(folder: Path) -> tuple[int, int]:
    """SmolLM2's tokenizer (the default model's GGUF, rebuilt as a `tokenizers` pipeline) as
    tokenizer.json + tokenizer_config.json; returns (bos, eos) ids."""
    from cadence.model.loader import default_model_path
    from cadence.model.gguf_tokenizer import tokenizer_from_gguf

    import gguf

    tok = tokenizer_from_gguf(gguf.GGUFReader(str(default_model_path())))
    tok.backend.save(str(folder / "tokenizer.json"))
    bos = tok.bos_token_id if tok.bos_token_id is not None else 1
    eos = tok.eos_token_id if tok.eos_token_id is not None else 2
    name = tok.backend.id_to_token
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(bos), "eos_token": name(eos),
        "unk_token": name(0), "model_max_length": 8192, "add_bos_token": False}, indent=1))
    return bos, eos


def write_checkpoint(shape: HFShape, folder: Path, shard_gib: float, seed: int) -> int:
    """The random checkpoint in `folder`, shard by shard; returns its bytes."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    bos, eos = write_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(shape.config(bos, eos), indent=1))
    gen = torch.Generator().manual_seed(seed)
    names = tensor_shapes(shape)
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    weight_map: dict[str, int] = {}
    total = 0
    limit = shard_gib * GIB

    def flush(last: bool) -> None:
        index = len(shards)
        # Written at once (named later): the shard count is unknown until the end.
        save_file(shards[-1], str(folder / f"part-{index:05d}.safetensors"), metadata={"format": "pt"})
        shards[-1] = {}
        if not last:
            shards.append({})
            sizes.append(0)

    for name, dims in names:
        nbytes = 2
        for d in dims:
            nbytes *= d
        if sizes[-1] and sizes[-1] + nbytes > limit:
            flush(last=False)
        if name.endswith("norm.weight"):
            t = torch.ones(dims, dtype=torch.bfloat16)
        else:
            t = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)
        shards[-1][name] = t
        sizes[-1] += nbytes
        weight_map[name] = len(shards)
        total += nbytes
    flush(last=True)
    count = len(shards)
    final = {}
    for i in range(1, count + 1):
        target = f"model-{i:05d}-of-{count:05d}.safetensors"
        os.replace(folder / f"part-{i:05d}.safetensors", folder / target)
        final[i] = target
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {n: final[i] for n, i in weight_map.items()}}, indent=1))
    return total


# Runs the converter as its own __main__. Its Llama vocabulary step imports sentencepiece
# before it looks for a tokenizer.model (then falls back to tokenizer.json's BPE): where the
# package is not installed, a placeholder module lets that fallback run (it is never called).
_CONVERT_RUNNER = """
import importlib.machinery, runpy, sys, types
import transformers  # (first: it probes for sentencepiece at import)
try:
    import sentencepiece
except ImportError:
    placeholder = types.ModuleType("sentencepiece")
    placeholder.__spec__ = importlib.machinery.ModuleSpec("sentencepiece", None)
    placeholder.SentencePieceProcessor = None
    sys.modules["sentencepiece"] = placeholder
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, script.rsplit("/", 1)[0])
runpy.run_path(script, run_name="__main__")
"""


def convert(folder: Path, out: Path, script: Path, gguf_py: str) -> None:
    """llama.cpp's converter: the checkpoint as a bf16 GGUF."""
    env = dict(os.environ)
    if gguf_py == "venv":
        env["NO_LOCAL_GGUF"] = "1"
    cmd = [sys.executable, "-c", _CONVERT_RUNNER, str(script), str(folder), "--outfile", str(out),
           "--outtype", "bf16"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed ({done.returncode}):\n{done.stderr[-3000:]}")


def quantize(binary: Path, src: Path, out: Path, qtype: str, threads: int) -> None:
    done = subprocess.run([str(binary), str(src), str(out), qtype, str(threads)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize {qtype} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def checkpoint_bytes(shape: HFShape) -> int:
    """Bytes of the shape's bf16 checkpoint (also about its bf16 GGUF's)."""
    total = 0
    for _, dims in tensor_shapes(shape):
        n = 2
        for d in dims:
            n *= d
        total += n
    return total


# Bytes per weight of each output type relative to bf16's 2 (an upper estimate: the K-quant mixes
# keep some tensors at 6 bits), for the disk check.
_TYPE_SHARE = {"Q4_K_M": 0.34, "Q8_0": 0.54}


def disk_needed(shape_name: str, types: list[str], have_bf16: bool = False) -> int:
    """Peak bytes a build writes: the checkpoint and the bf16 GGUF side by side while the
    converter runs (the checkpoint is deleted right after), then the bf16 GGUF beside the
    quantized files."""
    bf16 = checkpoint_bytes(SHAPES[shape_name])
    outputs = sum(int(bf16 * _TYPE_SHARE.get(t, 1.0)) for t in types)
    return max(0 if have_bf16 else 2 * bf16, bf16 + outputs)


def check_disk(shape_name: str, out_dir: Path, types: list[str], have_bf16: bool = False) -> None:
    """Refuse to start a build the disk cannot hold (OSError naming the bytes): the 8B's
    checkpoint and bf16 GGUF are 15 GiB each, and a disk that fills in the converter leaves
    both behind half written."""
    needed = disk_needed(shape_name, types, have_bf16)
    free = shutil.disk_usage(out_dir).free
    if needed > free:
        raise OSError(f"{shape_name}: the build needs about {needed / GIB:.1f} GiB on {out_dir} at "
                      f"its peak, {free / GIB:.1f} GiB are free")
    print(f"{shape_name}: needs about {needed / GIB:.1f} GiB of disk at its peak, "
          f"{free / GIB:.1f} GiB free", flush=True)


def build(shape_name: str, types: list[str], out_dir: Path, *, seed: int = 0, shard_gib: float = 2.0,
          threads: int = 2, gguf_py: str = "vendor", keep_intermediate: bool = False,
          cache: Path | None = None) -> dict[str, Path]:
    """The GGUF files of one shape, one per type ({type: path}); files already there are kept."""
    cache = cache or llamacpp_cache()
    script, binary = converter_script(cache), quantize_binary(cache)
    if script is None or binary is None:
        raise FileNotFoundError(f"llama.cpp is not in {cache} (needs llama_cpp_python-*/vendor/llama.cpp "
                                "and build/bin/llama-quantize; benchmarks/llamacpp_peer.py --build)")
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {t: out_dir / f"{shape_name}-hf-random-{t}.gguf" for t in types}
    todo = [t for t, p in targets.items() if not p.exists()]
    if not todo:
        return targets
    folder = out_dir / f"{shape_name}-hf-random"
    bf16 = out_dir / f"{shape_name}-hf-random-BF16.gguf"
    partials = [bf16.with_suffix(".tmp"), *(targets[t].with_suffix(".tmp") for t in todo)]
    check_disk(shape_name, out_dir, todo, have_bf16=bf16.exists())
    try:
        if not bf16.exists():
            start = time.perf_counter()
            total = write_checkpoint(SHAPES[shape_name], folder, shard_gib, seed)
            print(f"{shape_name}: checkpoint {total / GIB:.2f} GiB in {time.perf_counter() - start:.0f} s", flush=True)
            start = time.perf_counter()
            convert(folder, bf16.with_suffix(".tmp"), script, gguf_py)
            os.replace(bf16.with_suffix(".tmp"), bf16)
            print(f"{shape_name}: converted in {time.perf_counter() - start:.0f} s", flush=True)
            if not keep_intermediate:
                shutil.rmtree(folder, ignore_errors=True)
        for t in todo:
            start = time.perf_counter()
            partial = targets[t].with_suffix(".tmp")
            quantize(binary, bf16, partial, t, threads)
            os.replace(partial, targets[t])
            print(f"{shape_name}: {t} {targets[t].stat().st_size / GIB:.2f} GiB in "
                  f"{time.perf_counter() - start:.0f} s -> {targets[t]}", flush=True)
    finally:
        # A step that failed leaves its partial output (the converter's is as large as the
        # checkpoint: 16 GB for the 8B); nothing resumes from it.
        for partial in partials:
            partial.unlink(missing_ok=True)
        if not keep_intermediate:
            shutil.rmtree(folder, ignore_errors=True)
            if all(p.exists() for p in targets.values()):
                bf16.unlink(missing_ok=True)
    return targets


def check(path: Path, tokens: int = 4) -> str:
    """Load the file with cadence's defaults and generate a few greedy tokens."""
    from cadence import LLM
    from cadence.core.sampling_params import SamplingParams

    start = time.perf_counter()
    llm = LLM(model=str(path), num_gpu_blocks_override=64, startup_profile=False)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                    ignore_eos=True))
    return f"{path.name}: {len(out[0].outputs[0].token_ids)} tokens in {time.perf_counter() - start:.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", nargs="+", choices=tuple(SHAPES), required=True)
    p.add_argument("--types", nargs="+", default=["Q4_K_M", "Q8_0"], help="llama-quantize types")
    p.add_argument("--out", type=Path, default=None, help="folder of the files (default: $CADENCE_SHAPES_DIR "
                   "or ~/.cache/cadence/shapes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-gib", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=2, help="llama-quantize's threads")
    p.add_argument("--gguf-py", choices=("venv", "vendor"), default="vendor",
                   help="the gguf package the converter imports: the copy beside it, or this venv's")
    p.add_argument("--keep-intermediate", action="store_true", help="keep the checkpoint and the bf16 GGUF")
    p.add_argument("--check", action="store_true", help="load each file in cadence and generate a few tokens")
    args = p.parse_args(argv)
    out = args.out or default_out()
    for name in args.shape:
        files = build(name, args.types, out, seed=args.seed, shard_gib=args.shard_gib, threads=args.threads,
                      gguf_py=args.gguf_py, keep_intermediate=args.keep_intermediate)
        if args.check:
            for path in files.values():
                print(check(path), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
