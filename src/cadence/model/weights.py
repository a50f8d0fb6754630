"""Materialise a LlamaForCausalLM from a name -> tensor mapping, checking every name and shape."""

from __future__ import annotations

from typing import Iterable

import torch

from cadence.model.config import ModelConfig
from cadence.model.errors import ModelLoadError
from cadence.model.llama import LlamaForCausalLM

LM_HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"


def build_model(config: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]],
                dtype: torch.dtype, device: torch.device, source: str) -> LlamaForCausalLM:
    """The model with its parameters taken from `tensors` (cast to dtype, moved to device).

    The module is built on the meta device so no memory is spent on a random init; every
    parameter must then be provided with the exact shape, or ModelLoadError says which is wrong.
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        if name not in expected:
            if name == LM_HEAD and config.tie_word_embeddings:
                continue  # some tied checkpoints store the head anyway; the embedding wins
            raise ModelLoadError(f"{source}: unexpected tensor {name!r} (shape {tuple(tensor.shape)})")
        if tuple(tensor.shape) != expected[name]:
            raise ModelLoadError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected[name]}"
            )
        if not torch.isfinite(tensor).all():
            raise ModelLoadError(f"{source}: tensor {name!r} contains NaN or inf")
        state[name] = tensor.to(device=device, dtype=dtype)
    if config.tie_word_embeddings and EMBED in state:
        state[LM_HEAD] = state[EMBED]
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    # Inference only: no autograd bookkeeping even when a caller forgets inference_mode.
    model.requires_grad_(False)
    return model.eval()
