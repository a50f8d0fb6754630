"""vLLM's module path: `from cadence.sampling_params import SamplingParams` (as
`from vllm.sampling_params import ...`). The definitions live in cadence.core.sampling_params."""

from cadence.core.sampling_params import (  # noqa: F401 - re-exported names
    GuidedDecodingParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
