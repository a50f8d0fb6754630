"""Rotary position embeddings (Hugging Face "rotate_half" layout), by absolute position.

Every rope variant of HF's `modeling_rope_utils` that the families use (default, linear,
dynamic NTK, llama3, yarn, longrope) reduces to inverse frequencies over the rotated dims and an
amplitude (`attention_factor`) that multiplies cos and sin; `inverse_frequencies` computes both
with HF's float32 formulas. Partial rotary (Phi-4-mini: 0.75 of head_dim) rotates the leading
`rotary_dim` dims of each head and passes the rest through.

Two variants depend on the sequence length in HF, which recomputes them from the longest
position of the current forward. cadence decides per position instead, so a token's rotation
never depends on what it was batched or chunked with (invariant 1):
- dynamic NTK: position p uses seq_len = max(p + 1, max_position_embeddings): the default
  frequencies within max_position_embeddings (as HF), beyond it the base HF derives for a
  sequence that ends at p (HF's token-by-token decoding rotates each new key that way too);
- longrope: positions below original_max_position_embeddings use short_factor, later ones
  long_factor (HF switches the whole sequence to long_factor once it is longer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from cadence.model.config import RopeScaling


def _default_inv_freq(theta: float | torch.Tensor, dim: int) -> torch.Tensor:
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # [dim / 2]
    return 1.0 / (theta ** exponent)


def _yarn_inv_freq(s: RopeScaling, theta: float, dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    factor = s.factor
    original = s.original_max_position_embeddings or max_positions

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = float(mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim))
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast or 32), correction_dim(s.beta_slow or 1)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: avoids a division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # share of the unscaled frequency
    return interpolation * (1 - keep) + extrapolation * keep, attention_factor


def _llama3_inv_freq(s: RopeScaling, theta: float, dim: int, max_positions: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(theta, dim)
    old_context = s.original_max_position_embeddings or max_positions
    low_wavelen = old_context / s.low_freq_factor
    high_wavelen = old_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def inverse_frequencies(scaling: RopeScaling | None, theta: float, dim: int, max_positions: int,
                        seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim / 2] float32, attention_factor) as HF's rope init functions compute them
    for a sequence of seq_len tokens (None: the value HF starts from); dim = rotated dims."""
    kind = "default" if scaling is None else scaling.rope_type
    if kind == "default":
        return _default_inv_freq(theta, dim), 1.0
    if kind == "linear":
        return _default_inv_freq(theta, dim) / scaling.factor, 1.0
    if kind == "dynamic":
        length = max(seq_len or max_positions, max_positions)
        base = theta * ((scaling.factor * length / max_positions) - (scaling.factor - 1)) ** (dim / (dim - 2))
        return _default_inv_freq(base, dim), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(scaling, theta, dim, max_positions), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(scaling, theta, dim, max_positions)
    if kind == "longrope":
        original = scaling.original_max_position_embeddings or max_positions
        factor = max_positions / original if scaling.factor == 1.0 else scaling.factor
        attention_factor = scaling.attention_factor
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        long = seq_len is not None and seq_len > original
        ext = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32)
        return 1.0 / (ext * theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), attention_factor
    raise ValueError(f"rope scaling {kind!r} is not supported")


# The rows a RotaryEmbedding keeps per dtype (cos_sin with `end`): positions below this bound
# (rotary_dim 128 in float32: 1 KiB a position, 16 MiB at the bound; positions past it are
# computed per call), the first TABLE_BLOCK of them at once, then doubling as positions grow.
TABLE_MAX_POSITIONS = 16384
TABLE_BLOCK = 256


@dataclass(frozen=True)
class RotaryEmbedding:
    """One rope variant of a model (layers of one kind share it): cos/sin for any positions."""

    theta: float
    rotary_dim: int  # leading dims of a head that rotate (even)
    max_positions: int  # the model's max_position_embeddings
    scaling: RopeScaling | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, rotary_dim] for positions [T], computed in float32 (times the
        variant's amplitude) then cast, as HF does.

        end: one past the largest of the positions, where the caller knows it without reading
        the tensor (AttentionMetadata's host copies). Rows of positions below TABLE_MAX_POSITIONS
        then come from a table of this variant's rows, computed by the same operations when
        positions first reach them: two index_selects instead of the eight small ops of a
        computed row (each step pays them, ~50-100 us of a decode step's Python on a cold cache).
        The table holds what a computed row holds: torch's elementwise float ops give an
        element the same bits wherever it sits in its tensor (the test pins it), the reason a
        row already does not depend on what it is batched with (invariant 1)."""
        if end is not None:
            table = self._table(dtype, positions.device, end)
            if table is not None:
                cos, sin = table
                if positions.shape[0] == 1:  # its one position is end - 1: a row of the table
                    return cos[end - 1:end], sin[end - 1:end]  # [1, rotary_dim] views, read only
                return cos.index_select(0, positions), sin.index_select(0, positions)
        return self._compute(positions, dtype)

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq, amplitude = self._base
        pos = positions.float()
        if self._depends_on_position and bool((positions + 1 > self._switch).any()):
            # [T, dim / 2]: each position's own frequencies (module docstring).
            inv = inv_freq.expand(positions.shape[0], -1).clone()
            if self.scaling.rope_type == "longrope":
                late = (positions + 1 > self._switch).cpu()
                inv[late] = self._long
            else:
                for p in sorted({int(v) for v in positions.tolist() if v + 1 > self._switch}):
                    row, _ = inverse_frequencies(self.scaling, self.theta, self.rotary_dim,
                                                 self.max_positions, seq_len=p + 1)
                    inv[(positions == p).cpu()] = row
            freqs = pos[:, None] * inv.to(positions.device)
        else:
            freqs = pos[:, None] * inv_freq.to(positions.device)[None, :]  # [T, dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, rotary_dim]
        cos, sin = emb.cos(), emb.sin()
        if amplitude != 1.0:
            cos, sin = cos * amplitude, sin * amplitude
        return cos.to(dtype), sin.to(dtype)

    def _table(self, dtype: torch.dtype, device: torch.device,
               end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin) [P, rotary_dim] of positions [0, P), P >= end, or None past the table's
        bound (or, for the variants that depend on the position, past the length where a
        position's frequencies start to differ). Grown by doubling; threads that grow it at
        once (split-core teams) each build a whole table and the last one stays."""
        bound = min(self.max_positions, TABLE_MAX_POSITIONS)
        if self._depends_on_position:
            bound = min(bound, self._switch)
        if end > bound:
            return None
        key = (dtype, device)
        table = self._tables.get(key)
        have = 0 if table is None else table[0].shape[0]
        if have >= end:
            return table
        rows = min(bound, max(-(-end // TABLE_BLOCK) * TABLE_BLOCK, 2 * have))
        cos, sin = self._compute(torch.arange(have, rows, device=device), dtype)
        if table is not None:
            cos, sin = torch.cat((table[0], cos)), torch.cat((table[1], sin))
        self._tables[key] = (cos, sin)
        return cos, sin

    @cached_property
    def _tables(self) -> dict:
        """(dtype, device) -> (cos, sin) rows of positions [0, P) (_table)."""
        return {}

    @cached_property
    def _base(self) -> tuple[torch.Tensor, float]:
        """(inv_freq [dim / 2], amplitude) HF starts from (computed once)."""
        return inverse_frequencies(self.scaling, self.theta, self.rotary_dim, self.max_positions)

    @cached_property
    def _long(self) -> torch.Tensor:
        """longrope: the inv_freq of positions past the original length."""
        return inverse_frequencies(self.scaling, self.theta, self.rotary_dim, self.max_positions,
                                   seq_len=self._switch + 1)[0]

    @property
    def _depends_on_position(self) -> bool:
        return self.scaling is not None and self.scaling.rope_type in ("dynamic", "longrope")

    @property
    def _switch(self) -> int:
        """Sequence length past which a position's frequencies differ from the ones HF starts
        from (dynamic: max_position_embeddings; longrope: original_max_position_embeddings)."""
        if self.scaling.rope_type == "dynamic":
            return self.max_positions
        return self.scaling.original_max_position_embeddings or self.max_positions


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for each token: [T, head_dim], plain rope over the whole head (float32 then cast)."""
    return RotaryEmbedding(theta, head_dim, 1 << 30).cos_sin(positions, dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [T, heads, head_dim] by cos, sin: [T, rotary_dim]; dims past rotary_dim pass."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)
