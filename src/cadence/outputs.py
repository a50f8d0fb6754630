"""vLLM's module path: `from cadence.outputs import RequestOutput, CompletionOutput` (as
`from vllm.outputs import ...`). The definitions live in cadence.engine.llm_outputs."""

from cadence.engine.llm_outputs import (  # noqa: F401 - re-exported names
    CompletionOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
)
