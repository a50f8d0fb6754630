"""Load a model and its tokenizer from one GGUF file (llama.cpp's format).

The config comes from gguf_config (one mapping per GGUF architecture), tensor names from
gguf_names; tensors are decoded to float32 here, one at a time, by gguf-py's dequantizers (two
hot types by faster numpy code of the same arithmetic).
"""

from __future__ import annotations

from typing import Iterator

import gguf
import numpy as np
import torch

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_config import config_from_gguf
from cadence.model.gguf_fields import GGUFFile, gguf_value
from cadence.model.gguf_names import (LAYER_RE, ROPE_FACTOR_TENSORS, ROTARY_PERMUTED_ARCHS, expert_projections,
                                      hf_name, split_fused, unpermute_rotary)
from cadence.model.gguf_tokenizer import tokenizer_from_gguf
from cadence.model.llama import LlamaForCausalLM
from cadence.model.tokenizer import Tokenizer, TokenizerError
from cadence.model.weights import build_model

_Q = gguf.GGMLQuantizationType
# Tensor types this loader decodes: plain floats and every type gguf-py can dequantize.
DEQUANTIZABLE_TYPES = tuple(sorted(
    {_Q.F32, _Q.F16, _Q.F64, *gguf.quants._type_traits}, key=lambda t: t.value))


def dequantize(data: np.ndarray, tensor_type: gguf.GGMLQuantizationType) -> np.ndarray:
    """Float32 values of a GGUF tensor's raw data ([..., row bytes] for quantized types).

    Q4_1 and Q8_0 (the default model's types) are decoded over the whole tensor in a few numpy
    ops, with the same float32 arithmetic as gguf.quants (which works 16 rows at a time and is
    several times slower); every other type goes through gguf.quants.
    """
    if tensor_type == gguf.GGMLQuantizationType.Q4_1:
        # block: f16 scale d, f16 min m, 16 bytes of nibbles (low nibbles = values 0..15).
        blocks = np.ascontiguousarray(data).reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n_blocks, 1]
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        values = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1).astype(np.float32)
        return ((d * values) + m).reshape(*data.shape[:-1], -1)
    if tensor_type == gguf.GGMLQuantizationType.Q8_0:
        # block: f16 scale d, 32 int8 values.
        blocks = np.ascontiguousarray(data).reshape(-1, 34)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        values = blocks[:, 2:].view(np.int8).astype(np.float32)  # one temporary, then in place
        values *= d
        return values.reshape(*data.shape[:-1], -1)
    if tensor_type == gguf.GGMLQuantizationType.F64:
        return np.asarray(data, dtype=np.float32)
    return gguf.quants.dequantize(data, tensor_type)


def _tensors(reader: GGUFFile | gguf.GGUFReader, arch: str, config: ModelConfig,
             source: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) one tensor at a time: only the one being decoded is held
    here, build_model keeps what it needs."""
    rotary_permuted = arch in ROTARY_PERMUTED_ARCHS
    for tensor in reader.tensors:
        if tensor.name in ROPE_FACTOR_TENSORS:
            continue  # read into config.rope_scaling
        experts = expert_projections(tensor.name)
        if experts is not None:
            yield from _expert_tensors(tensor, *experts, source)
            continue
        name = hf_name(tensor.name, arch)
        fused = arch == "phi3" and name is None and LAYER_RE.match(tensor.name) is not None
        if name is None and not fused:
            raise ModelLoadError(f"{source}: unexpected GGUF tensor {tensor.name!r} for "
                                 f"architecture {arch!r}")
        weight = torch.from_numpy(_float_array(tensor, source))
        if fused:
            parts = split_fused(tensor.name, weight, config.q_size, config.kv_size)
            if parts is None:
                raise ModelLoadError(f"{source}: unexpected GGUF tensor {tensor.name!r} "
                                     f"(shape {tuple(weight.shape)}) for architecture {arch!r}")
            yield from parts
            continue
        if rotary_permuted and ".attn_q." in tensor.name:
            weight = unpermute_rotary(weight, config.num_heads)
        elif rotary_permuted and ".attn_k." in tensor.name:
            weight = unpermute_rotary(weight, config.num_kv_heads)
        yield name, weight


def _expert_tensors(tensor, prefix: str, projections: tuple[str, ...],
                    source: str) -> Iterator[tuple[str, torch.Tensor]]:
    """A 3-D expert tensor [E, N, K] as each expert's projections (views of one decoded array)."""
    weight = torch.from_numpy(_float_array(tensor, source))
    if weight.dim() != 3 or weight.shape[1] % len(projections):
        raise ModelLoadError(f"{source}: expert tensor {tensor.name!r} has shape {tuple(weight.shape)}")
    for e, rows in enumerate(weight.unbind(0)):
        for projection, part in zip(projections, rows.chunk(len(projections))):
            yield f"{prefix}.{e}.{projection}.weight", part


def _float_array(tensor, source: str) -> np.ndarray:
    """A tensor's values as a writable float32 array in torch's [rows, cols] order."""
    if tensor.tensor_type not in DEQUANTIZABLE_TYPES:
        raise ModelLoadError(
            f"{source}: tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, which "
            f"cannot be decoded (supported: {', '.join(t.name for t in DEQUANTIZABLE_TYPES)})")
    # GGUF lists dims innermost first; torch wants [rows, cols] = reversed.
    shape = tuple(int(d) for d in reversed(tensor.shape))
    try:
        array = dequantize(tensor.data, tensor.tensor_type)
        # Float tensors come back as read-only views of the memory-mapped file: those are
        # copied; a decoded array is already a fresh one (no second copy of a 670 MB table).
        return np.require(array, dtype=np.float32, requirements=["C", "W"]).reshape(shape)
    except (ValueError, NotImplementedError) as exc:
        raise ModelLoadError(f"{source}: cannot decode tensor {tensor.name!r}: {exc}") from exc


# GGUF types of the layers' matmul weights that the float32 fast path's integer formats hold
# (fused_decode.WEIGHT_FORMATS): Q4_1 exactly (4 bits, a scale and a minimum per 32, what
# `int4` stores), Q4_0 as a Q4_1 block with minimum -8 scales, Q8_0 in `int8`.
_INTEGER_FORMAT_OF_TYPE = {
    gguf.GGMLQuantizationType.Q4_0: "int4",
    gguf.GGMLQuantizationType.Q4_1: "int4",
    gguf.GGMLQuantizationType.Q8_0: "int8",
}


def gguf_weight_format(path: str) -> str | None:
    """The integer weight format ("int4", "int8") that holds this GGUF file's layer weights as
    stored, when most of them are of one such type; None for float or other quantized files
    (and for anything unreadable: load_gguf reports that)."""
    try:
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError):
        return None
    counts: dict[str, int] = {}
    for t in reader.tensors:
        match = LAYER_RE.match(t.name)
        if match and match.group(2).endswith(".weight") and "norm" not in match.group(2):
            fmt = _INTEGER_FORMAT_OF_TYPE.get(t.tensor_type, "other")
            counts[fmt] = counts.get(fmt, 0) + 1
    if not counts:
        return None
    best = max(counts, key=counts.get)
    return best if best != "other" and counts[best] * 2 > sum(counts.values()) else None


def load_gguf(path: str, dtype: torch.dtype, device: torch.device,
              native: bool = False) -> tuple[LlamaForCausalLM, ModelConfig, Tokenizer]:
    """Model, config and tokenizer from a GGUF file; ModelLoadError on anything unexpected.
    native: the matrices stay in their GGUF blocks (gguf_native; float32 compute on CPU)."""
    try:
        # Our one-pass reader: gguf.GGUFReader takes seconds on a large vocabulary's metadata.
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file: {exc}") from exc
    config = config_from_gguf(reader)
    arch = gguf_value(reader, "general.architecture")
    if native:
        from cadence.model.gguf_native import build_native_model

        if device.type != "cpu":
            raise ModelLoadError(f"{path}: GGUF-native weights compute on the CPU (got device {device})")
        model = build_native_model(reader, arch, config, path)
    else:
        model = build_model(config, _tensors(reader, arch, config, path), dtype, device, path)
    try:
        tokenizer = tokenizer_from_gguf(reader)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return model, config, tokenizer
