"""A GGUF weight matrix computed in its own format: no float copy of it ever exists.

`GGUFWeight` holds one 2-D tensor of a GGUF file as the file stores it: its ggml type, its shape
[N, K] (out x in features) and its raw bytes, [N, row_bytes] uint8 (row n's K / block_size
blocks side by side, as ggml lays out every type). Every type is read as stored by the
kernels, which decode each block in registers (kernels/gguf/blocks.h): a tensor of a
memory-mapped file is used in place (zero copy: the process holds what the page cache holds).
Row-wise blocks cost a float convert, multiply and FMA per column and group of 32 weights; Q3_K,
Q4_K, Q5_K and Q6_K (all of a Q4_K_M, Q5_K_M or Q3_K_M file's layers) are therefore also repacked
once at construction, losslessly, with 8 columns interleaved (kernels/gguf/q3k_x8.h .. q6k_x8.h:
928, 1152, 1408 and 1696 bytes per 2048 weights against the file's 880, 1152, 1408 and 1680),
which shares that work between 8 columns and
makes a decode step several times cheaper: `packed`. A weight built from a GGUF file's memory
map then hands the file's pages of its raw blocks back to the page cache (they are read again
only by `dequantize` / `embedding`), so the process holds the packed copy, not both.

  linear(x, bias)   x [..., K] float32 -> [..., N]: x @ W^T on the compiled kernels (threads split
                    the N columns). Quantized types multiply int8-quantized activations (per row
                    and group of 32 k, scale amax / 127, as llama.cpp's q8 activations) with
                    exact integer dot products; float types (F32, F16, BF16) compute in float32
                    (BF16 on the avx512bf16 tier: bf16 dot products on x rounded to bf16).
                    Without kernels (torch tier): a slab of rows at a time is dequantized and
                    multiplied with F.linear, never the whole matrix.
  dequantize()      [N, K] float32, exactly gguf-py's dequantize (reference and tests only).
  embedding(ids)    [T, K] float32: only the requested rows are dequantized.
  linear_many(ws, x) several weights of the same input in one call: [..., sum N], their outputs
                    side by side (a layer's q/k/v, gate/up: one quantization, one thread wake-up).
  take_rows(index)  a new weight of the rows in that order (a copy of their blocks).
  from_reader_tensor(t, rows)  the same from a file without the copy where every column is
                    repacked: the rows are gathered for the repack only, `row_order` says
                    which file row each is (llama.cpp's q/k row permutation, Phi-3's fused
                    tensors; an 8B file's q/k were otherwise held twice, ~0.75 GiB).

Accuracy of `linear` on quantized types: the result is x_q @ dequant(W)^T up to float32 summation
order, where x_q is x quantized per row and 32 k as above: its error against x @ dequant(W)^T
is that of 8-bit activations: each element of x moves by at most amax / 254 of its group, about
0.6% of the output's norm for Gaussian activations (the tests bound it at 1.5%). Each row's
result is the same whatever rows share its call (batch-invariant, bit for bit).

A model layer holds one GGUFWeight per GGUF tensor (q, k and v may each have their own type in
a Q4_K_M file) in place of a float weight and calls `linear` on each.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from cadence.model.kernels.cpu_ops import load_cpu_kernels

Q = GGMLQuantizationType
# The types computed natively; any other raises ValueError naming them.
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
    Q.IQ4_NL, Q.IQ4_XS,
)
# Repacked at construction with 8 columns interleaved (kernels/gguf/q3k_x8.h .. q6k_x8.h).
_REPACKED_TYPES = (Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
_FLOAT_DTYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
# Types whose embedding rows the kernels decode (kernels.gguf_embedding: gguf-py's values, ~0.2 ms
# less per decode step than gguf-py's own per-call work on one row).
_EMBEDDING_KERNEL_TYPES = frozenset({Q.Q4_K, Q.Q6_K, Q.Q8_0})
# Float32 values dequantized at once on the torch path (64 MiB).
_SLAB_VALUES = 1 << 24


def check_supported(ggml_type: GGMLQuantizationType | int) -> GGMLQuantizationType:
    """The type as a GGMLQuantizationType, or a ValueError naming it and the supported ones."""
    try:
        qtype = GGMLQuantizationType(int(ggml_type))
    except ValueError:
        qtype = None
    if qtype not in SUPPORTED_TYPES:
        name = qtype.name if qtype is not None else f"ggml type {int(ggml_type)}"
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"GGUF weight type {name} is not supported; supported types: {supported}")
    return qtype


def row_bytes(ggml_type: GGMLQuantizationType, K: int) -> int:
    """Bytes of one row of K weights of `ggml_type` (K a multiple of its block size)."""
    block, size = GGML_QUANT_SIZES[ggml_type]
    if K % block:
        raise ValueError(f"{ggml_type.name}: a row of {K} weights is not a whole number of {block}-weight blocks")
    return K // block * size


def _as_byte_rows(data: np.ndarray | torch.Tensor, N: int) -> torch.Tensor:
    """data's bytes as a [N, bytes per row] uint8 tensor, sharing its memory (a memory map too)."""
    if isinstance(data, torch.Tensor):
        return data.contiguous().view(torch.uint8).reshape(N, -1)
    array = np.ascontiguousarray(data).view(np.uint8).reshape(N, -1)
    with warnings.catch_warnings():
        # A read-only memory map: torch warns that writing through the tensor is undefined; the
        # blocks are only ever read.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _release_file_pages(blocks: torch.Tensor) -> None:
    """Drop this process's mapping of the whole pages inside `blocks`, a read-only view of a
    file's memory map (MADV_DONTNEED on a shared file mapping: the pages stay in the page
    cache and are mapped again on the next read). Never call it on anonymous memory: there it
    would zero the pages."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = (blocks.data_ptr() + page - 1) // page * page
    end = (blocks.data_ptr() + blocks.numel()) // page * page
    if end > start:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # MADV_DONTNEED


@dataclass(frozen=True, eq=False)
class GGUFWeight:
    """One [N, K] GGUF weight in its ggml type's own blocks (see the module docstring)."""

    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]  # (N, K): out_features, in_features
    blocks: torch.Tensor = field(repr=False)  # [N, row_bytes(ggml_type, K)] uint8, possibly a view of a memory map
    # Q3_K / Q4_K / Q5_K / Q6_K with compiled kernels: the whole octets of columns repacked,
    # [N // 8, K / 256 * (928 | 1152 | 1408 | 1696)] uint8 (made in __post_init__); None otherwise.
    packed: torch.Tensor | None = field(default=None, repr=False)
    # [N] int64 or None: row i of the weight is row row_order[i] of `blocks` (rows a file stores in
    # another order or fused with others, read in place: from_reader_tensor(rows=...)). Only with
    # `packed` holding every column (N a multiple of 8): the kernels never read `blocks` then.
    row_order: torch.Tensor | None = field(default=None, repr=False)
    # What the kernels get as the row-wise blocks: `blocks`, or none with row_order.
    kernel_blocks: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        qtype = check_supported(self.ggml_type)
        object.__setattr__(self, "ggml_type", qtype)
        N, K = self.shape
        expected = (N if self.row_order is None else self.blocks.shape[0], row_bytes(qtype, K))
        if self.blocks.dtype != torch.uint8 or tuple(self.blocks.shape) != expected or not self.blocks.is_contiguous():
            raise ValueError(f"GGUFWeight {qtype.name} [{N}, {K}]: blocks must be contiguous uint8 {list(expected)}, "
                             f"got {self.blocks.dtype} {list(self.blocks.shape)}")
        if self.row_order is not None and (self.packed is None or N % 8 or self.row_order.shape != (N,)):
            raise ValueError("GGUFWeight: row_order needs [N] rows, N a multiple of 8, every column packed")
        kernels = load_cpu_kernels()
        if self.packed is None and qtype in _REPACKED_TYPES and N >= 8 and kernels is not None:
            object.__setattr__(self, "packed", kernels.gguf_repack(self.blocks, int(qtype), N, K))
        object.__setattr__(self, "kernel_blocks", self.blocks if self.row_order is None else self.blocks.new_empty(0))

    @classmethod
    def from_data(cls, ggml_type: GGMLQuantizationType | int, shape: tuple[int, int],
                  data: np.ndarray | torch.Tensor) -> GGUFWeight:
        """A weight over `data`'s bytes (numpy, memory map or torch), without copying them."""
        qtype = check_supported(ggml_type)
        N, K = int(shape[0]), int(shape[1])
        return cls(qtype, (N, K), _as_byte_rows(data, N))

    @classmethod
    def from_reader_tensor(cls, tensor, rows: torch.Tensor | None = None) -> GGUFWeight:
        """A 2-D tensor of a gguf.GGUFReader, read in place from the file's memory map; with
        `rows` ([n] int), the weight of those rows in that order (llama.cpp's q/k row
        permutation undone, a fused tensor split). Where the kernels repack every column, the
        rows are gathered only for the repack (a temporary), and the weight keeps the file's
        blocks in place with `row_order`: a permuted 8B model holds no copy of its q/k rows."""
        if len(tensor.shape) != 2:
            raise ValueError(f"{tensor.name}: a GGUFWeight is 2-D, this tensor has shape {list(tensor.shape)}")
        K, N = (int(v) for v in tensor.shape)  # ggml lists the fastest dimension first
        qtype = check_supported(tensor.tensor_type)
        raw = _as_byte_rows(tensor.data, N)
        if rows is None:
            weight = cls(qtype, (N, K), raw)
        else:
            rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
            n = rows.numel()
            kernels = load_cpu_kernels()
            if qtype in _REPACKED_TYPES and n >= 8 and n % 8 == 0 and kernels is not None:
                packed = kernels.gguf_repack(raw.index_select(0, rows), int(qtype), n, K)
                weight = cls(qtype, (n, K), raw, packed, rows)
            else:
                return cls(qtype, (n, K), raw.index_select(0, rows))  # a copy of those rows' blocks
        if weight.packed is not None:
            _release_file_pages(raw)
        return weight

    @classmethod
    def experts_from_reader_tensor(cls, tensor, parts: int = 1) -> list[list[GGUFWeight]]:
        """A 3-D expert tensor of a gguf.GGUFReader (ggml dims [K, parts * N, E]: each expert's
        rows one after the other) as E lists of `parts` [N, K] weights, each read in place from
        the file's memory map (an expert's rows are contiguous blocks; the K-quants repacked as
        every weight is, and their file pages then released)."""
        if len(tensor.shape) != 3:
            raise ValueError(f"{tensor.name}: an expert tensor is 3-D, this one has shape {list(tensor.shape)}")
        K, rows, E = (int(v) for v in tensor.shape)
        if rows % parts:
            raise ValueError(f"{tensor.name}: {rows} rows per expert do not split into {parts} projections")
        qtype = check_supported(tensor.tensor_type)
        raw = _as_byte_rows(tensor.data, E * rows).reshape(E, rows, -1)  # [E, rows, row_bytes]
        N = rows // parts
        weights = [[cls(qtype, (N, K), raw[e, p * N:(p + 1) * N]) for p in range(parts)] for e in range(E)]
        if all(w.packed is not None for expert in weights for w in expert):
            _release_file_pages(raw)
        return weights

    @classmethod
    def quantize(cls, weight: torch.Tensor, ggml_type: GGMLQuantizationType | int) -> GGUFWeight:
        """A float [N, K] weight quantized with gguf-py (tests and benchmarks: the types gguf-py
        can quantize: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)."""
        qtype = check_supported(ggml_type)
        array = weight.detach().to(torch.float32).cpu().numpy()
        if qtype == Q.F32:
            data = array
        elif qtype == Q.F16:
            data = array.astype(np.float16)
        else:
            data = gguf_quants.quantize(array, qtype)
        return cls.from_data(qtype, tuple(weight.shape), np.ascontiguousarray(data))

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the kernels read: the file's bytes of the tensor, or for a repacked K-quant
        the packed copy plus the row-wise columns past its last whole octet."""
        if self.packed is None:
            return self.blocks.numel()
        return self.packed.numel() + (self.shape[0] % 8) * self.blocks.shape[1]

    def _dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [n, row_bytes] of the blocks -> [n, K] float32 (gguf-py's dequantization)."""
        if self.ggml_type in _FLOAT_DTYPES:
            return rows.view(_FLOAT_DTYPES[self.ggml_type]).to(torch.float32)
        return torch.from_numpy(gguf_quants.dequantize(rows.numpy(), self.ggml_type))

    def _block_rows(self, start: int, end: int) -> torch.Tensor:
        """The blocks of the weight's rows [start, end): [end - start, row_bytes] uint8."""
        if self.row_order is None:
            return self.blocks[start:end]
        return self.blocks.index_select(0, self.row_order[start:end])

    def dequantize(self) -> torch.Tensor:
        """The whole weight [N, K] as float32 (reference and tests only)."""
        return self._dequantize_rows(self._block_rows(0, self.shape[0])).reshape(self.shape).clone()

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] (int) of the weight as float32 [T, K]: only those rows are dequantized."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.shape[0]):
            raise IndexError(f"embedding: ids outside [0, {self.shape[0]})")
        if self.row_order is not None:
            ids = self.row_order[ids]
        kernels = load_cpu_kernels() if self.ggml_type in _EMBEDDING_KERNEL_TYPES else None
        if kernels is not None and hasattr(kernels, "gguf_embedding") and self.blocks.device.type == "cpu":
            return kernels.gguf_embedding(self.blocks, int(self.ggml_type), ids.contiguous(), self.shape[1])
        return self._dequantize_rows(self.blocks.index_select(0, ids)).reshape(-1, self.shape[1]).clone()

    def take_rows(self, index: torch.Tensor) -> GGUFWeight:
        """A weight whose row i is row index[i] of this one (a copy of those rows' blocks, bit
        for bit: e.g. undoing llama.cpp's q/k row permutation, or splitting a fused tensor)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        source = index if self.row_order is None else self.row_order[index]
        return GGUFWeight(self.ggml_type, (index.numel(), self.shape[1]), self.blocks.index_select(0, source))

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] -> x @ W^T (+ bias) [..., N] float32 (see the module docstring)."""
        N, K = self.shape
        if x.shape[-1] != K:
            raise ValueError(f"linear: x has {x.shape[-1]} features, the {self.ggml_type.name} weight {K}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K).to(torch.float32).contiguous()
        b = None if bias is None else bias.to(torch.float32).contiguous()
        kernels = load_cpu_kernels()
        if kernels is not None and x2.device.type == "cpu":
            out = kernels.gguf_linear(x2, self.kernel_blocks, int(self.ggml_type), N, K, b, self.packed)
        else:
            out = self._torch_linear(x2, b)
        return out.reshape(*lead, N)

    @staticmethod
    def linear_many(weights: Sequence[GGUFWeight], x: torch.Tensor,
                    biases: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """x [..., K] -> [..., sum N]: each weight's x @ W^T (+ its bias) side by side (a layer's q,
        k and v; its gate and up), as torch.cat of their `linear`s gives, in one kernel call: the
        activations quantized once and one parallel region for all of them (see linear.cpp)."""
        K = weights[0].shape[1]
        if any(w.shape[1] != K for w in weights) or x.shape[-1] != K:
            raise ValueError(f"linear_many: x has {x.shape[-1]} features, the weights "
                             f"{[w.shape[1] for w in weights]}")
        biases = [None] * len(weights) if biases is None else list(biases)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K).to(torch.float32).contiguous()
        bs = [None if b is None else b.to(torch.float32).contiguous() for b in biases]
        kernels = load_cpu_kernels()
        if kernels is not None and x2.device.type == "cpu":
            out = kernels.gguf_linear_many(x2, [w.kernel_blocks for w in weights], [int(w.ggml_type) for w in weights],
                                           [w.shape[0] for w in weights], K, bs, [w.packed for w in weights])
        else:
            out = torch.cat([w._torch_linear(x2, b) for w, b in zip(weights, bs)], dim=-1)
        return out.reshape(*lead, out.shape[-1])

    def _torch_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The path without compiled kernels: slabs of rows dequantized one at a time."""
        N, K = self.shape
        step = max(1, _SLAB_VALUES // K)
        parts = [F.linear(x, self._dequantize_rows(self._block_rows(n, n + step)).reshape(-1, K))
                 for n in range(0, N, step)]
        out = torch.cat(parts, dim=-1)
        return out if bias is None else out + bias
