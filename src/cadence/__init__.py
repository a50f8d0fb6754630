"""cadence: an LLM inference server that keeps every stream smooth when long prompts arrive."""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so that `import cadence.core` never pulls torch (core must stay torch-free).
    if name == "LLM":
        from cadence.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from cadence.core.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
