"""Rotary position embeddings (Hugging Face "rotate_half" layout), by absolute position."""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for each token: [T, head_dim], computed in float32 then cast (as HF does).

    Computed per forward from the positions (cheap: T x head_dim/2), so the model holds no
    position cache that could go stale or live on the wrong device.
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponent)  # [head_dim / 2]
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [T, heads, head_dim] by cos, sin: [T, head_dim]."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return x * cos + _rotate_half(x) * sin
