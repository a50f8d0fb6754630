"""Fixtures for the model tests: loaded tiny checkpoints and their transformers twins."""

from __future__ import annotations

import pytest
import torch

from cadence.model.loader import load_model


@pytest.fixture(scope="session", params=["llama", "qwen2", "mistral"])
def tiny_pair(request):
    """(cadence LoadedModel fp32, transformers model fp32) for each tiny architecture."""
    import transformers

    path = request.getfixturevalue(f"tiny_{request.param}_dir")
    ours = load_model(path, dtype="float32", device="cpu")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, theirs


@pytest.fixture(scope="session")
def default_fp32(default_model_path):
    """The default SmolLM2 GGUF loaded in float32 on CPU."""
    return load_model(default_model_path, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def default_tokenizer(default_model_path):
    """The default model's tokenizer, rebuilt from its GGUF metadata."""
    import gguf

    from cadence.model.gguf_tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(gguf.GGUFReader(default_model_path))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir):
    from cadence.model.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(tiny_llama_dir)
