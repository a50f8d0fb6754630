"""Frozen configs of the decision layer: the scheduler's caps and the KV cache's shape.

Each field carries its CLI help text in `metadata["help"]` (and `metadata["choices"]` where the
value is one of a few names), so a command line can be generated from the dataclass. Knob names
follow vLLM's where the concept is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("eager", "chunked", "slo")
SCHEDULING_ORDERS = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler orders requests and caps each step."""

    policy: str = field(
        default="chunked",
        metadata={
            "help": "Batching policy. 'chunked': running decodes first, prompt chunks fill the "
            "rest of the token budget (stall-free). 'eager': whole prompts first, then decodes "
            "(the prefill/decode stall baseline; a prompt longer than the budget still runs "
            "whole, alone in its step). 'slo': decodes first, then prompt chunks sized so the "
            "predicted step time stays within --target-itl-ms.",
            "choices": POLICIES,
        },
    )
    max_num_batched_tokens: int = field(
        default=512,
        metadata={"help": "Token budget of one step: the most new tokens computed per step."},
    )
    max_num_seqs: int = field(
        default=64,
        metadata={"help": "Most requests running at once (and so in one step)."},
    )
    long_prefill_token_threshold: int = field(
        default=0,
        metadata={
            "help": "Chunked policy: the most prompt tokens one request gets in a step "
            "(0 = no cap beyond the token budget)."
        },
    )
    max_model_len: int = field(
        default=8192,
        metadata={"help": "Longest sequence (prompt + max_tokens) a request may reach."},
    )
    scheduling: str = field(
        default="fcfs",
        metadata={
            "help": "Request order. 'fcfs': first come, first served. 'priority': lower "
            "`priority` value first, then arrival time (as vLLM).",
            "choices": SCHEDULING_ORDERS,
        },
    )
    target_itl_ms: float = field(
        default=100.0,
        metadata={
            "help": "slo policy: the inter-token latency target, ms. While requests decode, "
            "prompt chunks are sized so the predicted step time (an online model fitted to "
            "measured steps) stays within it; at least one KV block of prompt still runs per "
            "step, and with no decode running the whole token budget is used."
        },
    )

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.scheduling not in SCHEDULING_ORDERS:
            raise ValueError(
                f"scheduling must be one of {SCHEDULING_ORDERS}, got {self.scheduling!r}"
            )
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
        _require_int("max_num_seqs", self.max_num_seqs, minimum=1)
        _require_int("long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0)
        _require_int("max_model_len", self.max_model_len, minimum=1)
        itl = self.target_itl_ms
        if isinstance(itl, bool) or not isinstance(itl, (int, float)) or not 0 < itl < float("inf"):
            raise ValueError(f"target_itl_ms must be a number > 0, got {itl!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Shape of the paged KV cache. The engine resolves `num_blocks` (from bytes or memory)
    before it builds the scheduler; the scheduler requires it set."""

    block_size: int = field(
        default=16,
        metadata={"help": "Tokens per KV cache block (the paging granularity)."},
    )
    num_blocks: int | None = field(
        default=None,
        metadata={"help": "Number of KV cache blocks (default: derived from memory)."},
    )
    kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata={"help": "Bytes of memory for the KV cache (used when num_blocks is unset)."},
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={"help": "Reuse KV blocks of identical full-block prompt prefixes."},
    )

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, minimum=1)
        if self.num_blocks is not None:
            _require_int("num_blocks", self.num_blocks, minimum=1)
        if self.kv_cache_memory_bytes is not None:
            _require_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, minimum=1)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}"
            )


def _require_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True as a block size is a bug, not a 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
