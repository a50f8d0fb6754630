"""EngineConfig: which model, on what device, and the scheduler's and KV cache's slices."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from cadence.core.config import CacheConfig, SchedulerConfig

# --kv-cache-dtype values cadence stores, and vLLM's fp8 values, which it refuses by name.
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")

# KV cache memory when neither num_blocks nor kv_cache_memory_bytes is given.
DEFAULT_KV_CACHE_MEMORY_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class EngineConfig:
    """Everything an LLMEngine is built from. Each component later receives only its slice."""

    model: str | None = field(
        default=None,
        metadata={"help": "GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct)."},
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Weights and activations dtype: auto, float32, bfloat16, float16 (the KV "
                    "cache follows it unless --kv-cache-dtype says otherwise).",
            "choices": ("auto", "float32", "bfloat16", "float16"),
        },
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto."})
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    trace_path: str | None = field(
        default=None, metadata={"help": "Write every step and request as JSON lines here."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the engine RNG used by unseeded random sampling."}
    )
    startup_profile: bool = field(
        default=True,
        metadata={
            "help": "Time a dozen synthetic steps at start so the slo policy's step-time "
            "model begins from this machine's speed (a few seconds on a slow CPU; only "
            "with a policy that models step time)."
        },
    )
    deterministic: bool = field(
        default=False,
        metadata={"help": "Compute in float32 on float32 weights, every GEMM on the packed kernels at "
                          "every row count, so that greedy and seeded outputs do not depend on batch, "
                          "chunk split, prefix-cache hits or preemption also for float models on CPUs "
                          "where `auto` computes in bf16. Integer weights (the default GGUF's int4, "
                          "int8) are batch-invariant without it; needs --dtype auto or float32, not "
                          "--quantization int8/int4."},
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Hugging Face tokenizer folder (tokenizer.json) to use instead of "
                          "the model's own."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "Chat template (a Jinja file, or the template text) that replaces "
                          "the model's."},
    )
    generation_config: str = field(
        default="auto",
        metadata={"help": "Default sampling values for requests that leave them unset: 'auto' "
                          "reads generation_config.json next to the model, 'vllm' uses "
                          "cadence's defaults, or a folder holding a generation_config.json."},
    )
    quantization: str | None = field(
        default=None,
        metadata={"help": "How the CPU float32 fast path stores weights: int4 (4-bit with a float16 "
                          "scale and minimum per 32 weights, as GGUF's Q4_1; the LM head int8), "
                          "int8 (a float32 scale per 32 weights), bf16, none (float32), or auto (default: with --dtype auto "
                          "on CPU, a GGUF stored in Q4_0/Q4_1 or Q8_0 keeps it as int4 or int8 computed in "
                          "float32, as llama.cpp does; other models int8 where --dtype auto computes in "
                          "float32, i.e. on CPUs without native bf16; a GGUF with K-quant (Q2_K .. Q6_K), "
                          "Q5 or IQ4_NL / IQ4_XS layers, e.g. every Q4_K_M or Q3_K_M file, computes "
                          "from its own blocks), or "
                          "gguf (any GGUF computed from its own blocks, memory-mapped).",
                  "choices": ("auto", "none", "bf16", "int8", "int4", "gguf")},
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={"help": "How the KV cache stores keys and values. 'auto': under float32 "
                          "compute a GGUF file's cache is float16 (llama.cpp's default) and a "
                          "Hugging Face checkpoint's its stored dtype (bfloat16/float16/float32, "
                          "vLLM's model dtype); a bf16 model's cache is bfloat16. float16 or "
                          "bfloat16 halve a float32 model's KV bytes (attention still computes "
                          "in float32, the pool holds twice the tokens); float32 keeps full "
                          "precision. vLLM's fp8 values are refused (not implemented).",
                  "choices": (*KV_CACHE_DTYPES, *FP8_KV_CACHE_DTYPES)},
    )
    telemetry_max_steps: int = field(
        default=10_000, metadata={"help": "Recent step records kept in memory."}
    )
    telemetry_max_finished: int = field(
        default=10_000, metadata={"help": "Recent finished request timelines kept in memory."}
    )

    def __post_init__(self) -> None:
        if self.kv_cache_dtype in FP8_KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r}: cadence has no fp8 KV "
                             "cache; use float16 or bfloat16 (half of float32's bytes) or auto")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r}: use one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError("scheduler must be a SchedulerConfig")
        if not isinstance(self.cache, CacheConfig):
            raise ValueError("cache must be a CacheConfig")
        if self.deterministic and self.dtype not in ("auto", "float32"):
            raise ValueError(f"deterministic computes in float32; it cannot run with "
                             f"dtype={self.dtype!r} (use auto or float32)")
        if self.deterministic and (self.quantization or "").lower() in ("int8", "int4"):
            raise ValueError("deterministic computes on float32 weights; it cannot run with "
                             f"quantization={self.quantization!r} (integer weights multiply "
                             "quantized activations)")

    @property
    def model_dtype(self) -> str:
        """The dtype to load the model in: float32 when deterministic."""
        return "float32" if self.deterministic else self.dtype


def resolve_num_blocks(
    cache: CacheConfig, bytes_per_block: int, max_num_seqs: int, max_model_len: int
) -> CacheConfig:
    """The cache config with num_blocks set.

    An explicit num_blocks wins. Otherwise memory (kv_cache_memory_bytes, default 2 GiB) is
    divided by the block cost, capped at what max_num_seqs sequences of max_model_len tokens
    could ever use, so a tiny model does not allocate gigabytes it cannot fill.
    """
    if cache.num_blocks is not None:
        return cache
    if bytes_per_block <= 0:
        raise ValueError(f"bytes_per_block must be positive, got {bytes_per_block}")
    memory = cache.kv_cache_memory_bytes or DEFAULT_KV_CACHE_MEMORY_BYTES
    from_memory = memory // bytes_per_block
    if from_memory < 1:
        raise ValueError(
            f"kv_cache_memory_bytes={memory} is less than one KV block ({bytes_per_block} bytes)"
        )
    ceiling = max_num_seqs * math.ceil(max_model_len / cache.block_size)
    return dataclasses.replace(cache, num_blocks=int(min(from_memory, ceiling)))
