"""Modules over GGUF weights kept in their own format (cadence.model.gguf_weight.GGUFWeight).

A model loaded natively from a GGUF file holds, in place of each nn.Linear's float weight and
of the token embedding, a GGUFWeight: the file's blocks, read in place from its memory map (or
a same-size copy where rows had to be reordered). No float copy of a matrix ever exists: a
linear multiplies the blocks in the kernels, the embedding dequantizes only the rows a step
looks up. The modules keep nn.Linear's / nn.Embedding's calling convention (in_features,
out_features, forward), so the decoder calls them as it calls the float ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cadence.model.gguf_weight import GGUFWeight


class GGUFLinear(nn.Module):
    """y = x @ W^T + b with W a GGUFWeight [out_features, in_features]; float32 compute."""

    def __init__(self, weight: GGUFWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.gguf_weight = weight
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        # A float bias is small: a real parameter, loaded with the float tensors.
        self.bias = None if bias is None else nn.Parameter(bias.to(torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features] in x's dtype (computed in float32)."""
        out = self.gguf_weight.linear(x, self.bias)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.gguf_weight.nbytes + (0 if self.bias is None else self.bias.numel() * 4)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"type={self.gguf_weight.ggml_type.name}, bias={self.bias is not None}")


class GGUFEmbedding(nn.Module):
    """Token embedding rows from a GGUFWeight [vocab, hidden]: only looked-up rows decoded."""

    def __init__(self, weight: GGUFWeight, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.gguf_weight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, embedding_dim]."""
        return self.gguf_weight.embedding(ids).to(self.dtype)

    @property
    def device(self) -> torch.device:
        return self.gguf_weight.blocks.device

    @property
    def nbytes(self) -> int:
        return self.gguf_weight.nbytes

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.gguf_weight.ggml_type.name}"


def linear_side_by_side(x: torch.Tensor, linears: Sequence[nn.Module]) -> torch.Tensor:
    """x [T, in] -> [T, sum out]: the linears' outputs side by side (torch.cat(..., -1)); GGUF
    linears of one input in one kernel call (GGUFWeight.linear_many)."""
    if all(isinstance(lin, GGUFLinear) for lin in linears):
        out = GGUFWeight.linear_many([lin.gguf_weight for lin in linears], x, [lin.bias for lin in linears])
        return out if out.dtype == x.dtype else out.to(x.dtype)
    return torch.cat([lin(x) for lin in linears], dim=-1)


def gguf_module_bytes(model: nn.Module) -> int:
    """Bytes of every GGUF weight the model holds (each weight once, tied ones shared)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, (GGUFLinear, GGUFEmbedding)):
            seen[id(module.gguf_weight)] = module.gguf_weight.nbytes
    return sum(seen.values())
