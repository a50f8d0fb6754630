"""Small integer tensors built from Python lists, fast enough to call many times per step.

torch.tensor(list) converts element by element through Python objects (~10 us for 64 ints, ~50 us
for a 64 x 9 block table); array.array packs the ints in C and torch.frombuffer wraps that
buffer without a copy (~3 us). The step's metadata builds about ten such tensors, so at decode
batch sizes this is a visible share of the engine's time outside the forward.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterable, Sequence

import torch

_TYPECODES = {torch.int64: "q", torch.int32: "i"}


def host_tensor(values: Iterable[int], dtype: torch.dtype = torch.int64,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """1-D tensor of `values` (ints) as `dtype` (int64 or int32), moved to `device`."""
    buf = array.array(_TYPECODES[dtype], values)  # raises OverflowError on out-of-range ints
    t = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
    return t if torch.device(device).type == "cpu" else t.to(device)


def host_matrix(rows: Sequence[Sequence[int]], width: int, dtype: torch.dtype = torch.int32,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(rows), width] tensor; every row must hold exactly `width` ints."""
    flat = host_tensor(itertools.chain.from_iterable(rows), dtype, "cpu")
    if flat.numel() != len(rows) * width:
        raise ValueError(f"rows of {width} ints expected, got {flat.numel()} ints in {len(rows)} rows")
    t = flat.view(len(rows), width)
    return t if torch.device(device).type == "cpu" else t.to(device)
