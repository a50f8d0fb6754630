"""Build a model whose matrices stay in their GGUF blocks (`--quantization gguf`).

Every 2-D weight of the file (the layers' projections, the token embedding, the output head)
becomes a GGUFWeight over the file's memory map, in the module that uses it (GGUFLinear,
GGUFEmbedding), and each expert's rows of a 3-D expert tensor (qwen3moe, Mixtral) one per
expert projection; only the 1-D tensors (norms, biases) are decoded to float32. No float copy of
a matrix exists at any moment, and the process holds what the page cache holds of the file.
Rows that llama.cpp's converter reordered (q/k of llama-family files) or fused (Phi-3's qkv and
gate/up) are taken apart by row index (GGUFWeight.from_reader_tensor(rows=...)): gathered for the
repack only, the file's blocks read in place otherwise (a copy of the same blocks where a weight
keeps row-wise columns).
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.gguf_modules import GGUFEmbedding, GGUFLinear
from cadence.model.gguf_names import (LAYER_RE, ROPE_FACTOR_TENSORS, ROTARY_PERMUTED_ARCHS, expert_projections,
                                      hf_name, split_fused, unpermute_rotary)
from cadence.model.gguf_weight import GGUFWeight, check_supported
from cadence.model.llama import LlamaForCausalLM

EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


# Types the float path also holds exactly (a float file): `--quantization auto` leaves those to
# --dtype; any other matrix type makes auto choose the native path.
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def has_quantized_matrices(path: str) -> bool:
    """Whether the GGUF file's layer matrices include a quantized type (False when unreadable:
    loading reports that)."""
    from cadence.model.gguf_fields import GGUFFile

    try:
        reader = GGUFFile(path)
    except (ValueError, OSError, EOFError, IndexError):
        return False
    return any(len(t.shape) in (2, 3) and LAYER_RE.match(t.name) and t.tensor_type.name not in _FLOAT_TYPES
               for t in reader.tensors)


def _row_index(rows: int) -> torch.Tensor:
    """[rows, 1] row numbers: reordered like a weight, they say which rows to take."""
    return torch.arange(rows).unsqueeze(1)


def _weights_of(tensor, arch: str, config: ModelConfig, source: str):
    """(HF name, GGUFWeight or float32 tensor) pairs of one GGUF tensor."""
    experts = expert_projections(tensor.name)
    if experts is not None:  # [E, N, K]: each expert's projections, on the file's blocks
        prefix, projections = experts
        try:
            per_expert = GGUFWeight.experts_from_reader_tensor(tensor, len(projections))
        except ValueError as exc:
            raise ModelLoadError(f"{source}: tensor {tensor.name!r}: {exc}") from exc
        return [(f"{prefix}.{e}.{projection}.weight", weight)
                for e, weights in enumerate(per_expert) for projection, weight in zip(projections, weights)]
    name = hf_name(tensor.name, arch)
    fused = arch == "phi3" and name is None and LAYER_RE.match(tensor.name) is not None
    if name is None and not fused:
        raise ModelLoadError(f"{source}: unexpected GGUF tensor {tensor.name!r} for architecture {arch!r}")
    if len(tensor.shape) != 2:
        # Norms and biases: small, decoded to float32 (F32 in every file llama.cpp writes).
        values = torch.from_numpy(tensor.data.astype("float32", copy=True)).reshape(
            tuple(int(d) for d in reversed(tensor.shape)))
        if ".bias" in name and arch in ROTARY_PERMUTED_ARCHS and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_heads if ".q_proj." in name else config.num_kv_heads
            values = unpermute_rotary(values, heads)
        return [(name, values)]
    rows = int(tensor.shape[1])  # ggml lists the fastest dimension first: [K, N]
    try:
        check_supported(tensor.tensor_type)
        if fused:
            parts = split_fused(tensor.name, _row_index(rows), config.q_size, config.kv_size)
            if parts is None:
                raise ModelLoadError(f"{source}: unexpected GGUF tensor {tensor.name!r} for architecture {arch!r}")
            return [(part_name, GGUFWeight.from_reader_tensor(tensor, index[:, 0])) for part_name, index in parts]
        if arch in ROTARY_PERMUTED_ARCHS and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            heads = config.num_heads if ".attn_q." in tensor.name else config.num_kv_heads
            return [(name, GGUFWeight.from_reader_tensor(tensor, unpermute_rotary(_row_index(rows), heads)[:, 0]))]
        return [(name, GGUFWeight.from_reader_tensor(tensor))]
    except ValueError as exc:
        raise ModelLoadError(f"{source}: tensor {tensor.name!r}: {exc}") from exc


def _install(model: nn.Module, name: str, weight: GGUFWeight, source: str) -> None:
    """Put `weight` in place of the float parameter `name` (a Linear's or the embedding's)."""
    module_path, _, leaf = name.rpartition(".")
    try:
        old = model.get_submodule(module_path)
    except AttributeError as exc:
        raise ModelLoadError(f"{source}: unexpected tensor {name!r}") from exc
    expected = tuple(getattr(old, "weight").shape) if hasattr(old, "weight") else None
    if leaf != "weight" or expected != tuple(weight.shape):
        raise ModelLoadError(f"{source}: tensor {name!r} has shape {tuple(weight.shape)}, expected {expected}")
    if isinstance(old, nn.Embedding):
        new: nn.Module = GGUFEmbedding(weight)
    elif isinstance(old, nn.Linear):
        bias = None if old.bias is None else torch.zeros(old.out_features)
        new = GGUFLinear(weight, bias)
    else:
        raise ModelLoadError(f"{source}: tensor {name!r} is not a linear or embedding weight")
    parent_path, _, child = module_path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, child, new)


def build_native_model(reader, arch: str, config: ModelConfig, source: str) -> LlamaForCausalLM:
    """The model of a GGUF file with its matrices as GGUFWeights (see the module docstring)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    floats: dict[str, torch.Tensor] = {}
    installed: set[str] = set()
    for tensor in reader.tensors:
        if tensor.name in ROPE_FACTOR_TENSORS:
            continue  # read into config.rope_scaling
        for name, value in _weights_of(tensor, arch, config, source):
            if isinstance(value, GGUFWeight):
                _install(model, name, value, source)
                installed.add(name)
            else:
                floats[name] = value
    if config.tie_word_embeddings or LM_HEAD not in installed:
        if EMBED not in installed:
            raise ModelLoadError(f"{source}: no token embedding tensor")
        model.lm_head = GGUFLinear(model.model.embed_tokens.gguf_weight)
        installed.add(LM_HEAD)
    expected = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    for name, value in floats.items():
        if name not in expected:
            raise ModelLoadError(f"{source}: unexpected tensor {name!r} (shape {tuple(value.shape)})")
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"{source}: tensor {name!r} has shape {tuple(value.shape)}, "
                                 f"expected {tuple(expected[name].shape)}")
        if not torch.isfinite(value).all():
            raise ModelLoadError(f"{source}: tensor {name!r} contains NaN or inf")
        module_path, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_path)
        setattr(module, leaf, nn.Parameter(value.to(torch.float32), requires_grad=False))
    missing = sorted(name for name, p in model.named_parameters() if p.device.type == "meta")
    if missing:
        raise ModelLoadError(f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    model.mark_native_gguf()
    model.requires_grad_(False)
    return model.eval()
