"""Errors raised while loading a model."""


class ModelLoadError(RuntimeError):
    """A model could not be loaded: missing file, unknown architecture, bad or missing tensor."""
