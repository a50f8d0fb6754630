"""Frozen configs of the decision layer: the scheduler's caps and the KV cache's shape.

Each field carries its CLI help text in `metadata["help"]` (and `metadata["choices"]` where the
value is one of a few names), so a command line can be generated from the dataclass. Knob names
follow vLLM's where the concept is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("eager", "chunked", "slo", "adaptive")
# Policies whose chunks a step-time model sizes (the slo policy's; adaptive runs it when colocated).
STEP_TIME_POLICIES = ("slo", "adaptive")
SCHEDULING_ORDERS = ("fcfs", "priority")
CORE_SPLITS = ("off", "auto", "disjoint", "interleave")


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler orders requests and caps each step."""

    policy: str = field(
        default="adaptive",
        metadata={
            "help": "Batching policy. 'chunked': running decodes first, prompt chunks fill the "
            "rest of the token budget (stall-free). 'eager': whole prompts first, then decodes "
            "(the prefill/decode stall baseline; a prompt longer than the budget still runs "
            "whole, alone in its step). 'slo': decodes first, then prompt chunks "
            "sized so the predicted step time stays within --target-itl-ms where the machine "
            "can reach it, but never so small that a prompt's prefill takes more than "
            "--max-prefill-slowdown times its unchunked time (the step-time model is learned "
            "online from this machine's own steps). 'adaptive' (default): colocated slo steps while no "
            "prompt waits beside running decodes, else prompt chunks on every core with the "
            "decode steps between their layers (--core-split interleave, the default with "
            "it; --core-split auto/disjoint: on split cores), paced to --target-itl-ms within "
            "--max-prefill-slowdown (else the reachable pace, reported); behind "
            "a --disagg router the router's 'auto' routing adds disaggregation per request. "
            "With one core: slo.",
            "choices": POLICIES,
        },
    )
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={"help": "Token budget of one step: the most new tokens computed per step "
                  "(default: 2048 for the slo policy, whose chunks are sized by time, 512 "
                  "for the others)."},
    )
    max_num_seqs: int = field(
        default=64,
        metadata={"help": "Most requests running at once (and so in one step)."},
    )
    long_prefill_token_threshold: int = field(
        default=0,
        metadata={
            "help": "The most prompt tokens one request gets in a step (0 = no cap beyond "
            "the token budget); with --max-num-partial-prefills > 1 also the length above "
            "which a prompt counts as long (0 there means 4 percent of --max-model-len, as vLLM)."
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
            # The user-facing name (flag and LLM() keyword), vLLM's.
            "name": "scheduling_policy",
        },
    )
    target_itl_ms: float = field(
        default=100.0,
        metadata={
            "help": "slo policy: the inter-token latency target, ms. While requests decode, "
            "prompt chunks are sized so the predicted step time (an online model fitted to "
            "measured steps) stays within it; where the machine cannot reach it without "
            "slowing prefills by more than --max-prefill-slowdown, the reachable target is "
            "used instead and reported (cadence:itl_target_reachable_seconds). With no "
            "decode running the whole token budget is used."
        },
    )
    max_prefill_slowdown: float = field(
        default=1.15,
        metadata={
            "help": "slo policy (and adaptive's interleave pace: its decode steps take at most "
            "0.8 x this minus 1 of the prefill's time): the most that chunking may slow a "
            "prompt's prefill relative "
            "to running it whole in one step (1.15: 15 percent): the prompt's chunks are planned "
            "so that what chunking adds (each step's fixed cost: weights pass, decodes riding "
            "along; later chunks' attention against cached context) stays within 15 percent of "
            "the prompt's own work, under the step-time model. A large value lets "
            "--target-itl-ms win (with --max-stall-share 0)."
        },
    )
    max_stall_share: float = field(
        default=0.2,
        metadata={
            "help": "slo policy: where --target-itl-ms is out of reach, a long prompt is cut "
            "into the fewest chunks whose steps each take at most this share of the prompt's "
            "step run whole (the stall eager would cause), never into more than "
            "--max-prefill-slowdown allows: every chunk is one more gap over the target in each "
            "running stream, and the number of such gaps is what sets the streams' p99 ITL "
            "under Poisson arrivals. 0 plans the most chunks the slowdown allows."
        },
    )
    max_num_partial_prefills: int | None = field(
        default=None,
        metadata={
            "help": "The most prompts in prefill at once (vLLM's name). Above 1, short prompts "
            "(at most --long-prefill-token-threshold tokens) are served before long ones, "
            "so a chat message does not wait behind a document (default: 4 with the slo "
            "policy, 1 with the others)."
        },
    )
    max_long_partial_prefills: int = field(
        default=1,
        metadata={
            "help": "The most long prompts (over --long-prefill-token-threshold) in prefill "
            "at once, when --max-num-partial-prefills > 1 (vLLM's name)."
        },
    )

    interject_short_prompts: bool = field(
        default=True,
        metadata={
            "help": "A short prompt (at most --long-prefill-token-threshold tokens, as for "
            "partial prefills) that arrives while a long prompt's step is computing runs "
            "between two of that step's layers, so its first token does not wait for the "
            "step to end; the long step then finishes where it paused. Applies with "
            "--max-num-partial-prefills > 1 (the slo default) on engines whose forward can "
            "pause (the CPU and torch paths)."
        },
    )

    core_split: str | None = field(
        default=None,
        metadata={
            "help": "Prefill and decode side by side on split cores. 'auto': while prompts "
            "wait and requests decode, the cores are split between two thread teams over the "
            "same weights and KV cache (prompt chunks on one, decode steps on the other; a "
            "request's first token hands it over), the split decided per interval from the "
            "measured decode step time against --target-itl-ms; colocated --policy steps "
            "otherwise (and always with one core). First the prefill team gets every core and "
            "one decode thread runs on top, its steps paced to the target (kept while they "
            "take at most 0.8 of it). 'disjoint': as auto, the teams always on separate "
            "cores. 'interleave': no second team: the prompt chunk runs on every core and the "
            "decode steps run between two of its layers, a step each pace, set from the "
            "measured decode step so that decode steps take 10 percent of the prefill's time (at "
            "most 0.8 x --target-itl-ms). 'off': colocated "
            "steps only. Default: 'interleave' with --policy adaptive (an engine whose "
            "forward cannot pause between layers takes 'auto'), else 'off'.",
            "choices": CORE_SPLITS,
        },
    )
    split_prefill_chunk: int = field(
        default=512,
        metadata={
            "help": "--core-split: the most prompt tokens one prefill-team step computes (a "
            "short prompt arriving meanwhile waits at most that long for its first token). "
            "Under 'interleave' (where short prompts are interjected between layers) the first "
            "chunk's size and the smallest: later chunks are the largest whose layer segment "
            "fits a quarter of the decode pace, from their measured time, within "
            "--max-num-batched-tokens (all of it where the model pauses between row blocks "
            "of a layer's ops: core/interleave_pace.py)."
        },
    )

    def __post_init__(self) -> None:
        if self.core_split is None:
            # Frozen: the policy decides the default once, here.
            object.__setattr__(self, "core_split",
                               "interleave" if self.policy == "adaptive" else "off")
        if self.core_split not in CORE_SPLITS:
            raise ValueError(f"core_split must be one of {CORE_SPLITS}, got {self.core_split!r}")
        _require_int("split_prefill_chunk", self.split_prefill_chunk, minimum=1)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.scheduling not in SCHEDULING_ORDERS:
            raise ValueError(
                f"scheduling must be one of {SCHEDULING_ORDERS}, got {self.scheduling!r}"
            )
        if self.max_num_batched_tokens is None:
            # Frozen: resolve the policy-dependent default once, here.
            budget = 2048 if self.models_step_time else 512
            object.__setattr__(self, "max_num_batched_tokens", budget)
        _require_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
        if self.max_num_partial_prefills is None:
            object.__setattr__(self, "max_num_partial_prefills", 4 if self.models_step_time else 1)
        _require_int("max_num_partial_prefills", self.max_num_partial_prefills, minimum=1)
        _require_int("max_long_partial_prefills", self.max_long_partial_prefills, minimum=1)
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(
                f"max_long_partial_prefills ({self.max_long_partial_prefills}) must be <= "
                f"max_num_partial_prefills ({self.max_num_partial_prefills})"
            )
        if not isinstance(self.interject_short_prompts, bool):
            raise ValueError(f"interject_short_prompts must be a bool, got "
                             f"{self.interject_short_prompts!r}")
        _require_int("max_num_seqs", self.max_num_seqs, minimum=1)
        _require_int("long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0)
        _require_int("max_model_len", self.max_model_len, minimum=1)
        itl = self.target_itl_ms
        if isinstance(itl, bool) or not isinstance(itl, (int, float)) or not 0 < itl < float("inf"):
            raise ValueError(f"target_itl_ms must be a number > 0, got {itl!r}")
        slow = self.max_prefill_slowdown
        if isinstance(slow, bool) or not isinstance(slow, (int, float)) or not 1 < slow < float("inf"):
            raise ValueError(f"max_prefill_slowdown must be a number > 1, got {slow!r}")
        share = self.max_stall_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
            raise ValueError(f"max_stall_share must be a number in [0, 1), got {share!r}")

    @property
    def models_step_time(self) -> bool:
        """The policy sizes chunks with a step-time model (slo, and adaptive's colocated steps)."""
        return self.policy in STEP_TIME_POLICIES

    @property
    def long_prompt_threshold(self) -> int:
        """Prompts longer than this count as long for --max-long-partial-prefills (vLLM:
        the threshold, or 4% of max_model_len when it is 0)."""
        if self.long_prefill_token_threshold > 0:
            return self.long_prefill_token_threshold
        return max(1, self.max_model_len * 4 // 100)


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
        metadata={"help": "Number of KV cache blocks (default: derived from memory).",
                  "name": "num_gpu_blocks_override"},
    )
    kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata={"help": "Bytes of memory for the KV cache (used when num_blocks is unset)."},
    )
    kv_cache_memory_fraction: float | None = field(
        default=None,
        metadata={"help": "Share (0-1] of the RAM free once the weights are loaded (Linux "
                  "MemAvailable; CUDA's free memory on a GPU) that the KV pool takes, less one "
                  "step's activations (used when num_blocks and kv_cache_memory_bytes are "
                  "unset; vLLM's --gpu-memory-utilization maps here). Default: 2 GiB."},
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={"help": "Reuse KV blocks of identical full-block prompt prefixes."},
    )
    num_swap_blocks: int = field(
        default=0,
        metadata={"help": "Blocks of host KV memory that preempted requests are swapped out "
                  "to when copying their KV out and back is cheaper than recomputing it "
                  "(0 = always recompute)."},
    )
    kv_offload_dir: str | None = field(
        default=None,
        metadata={"help": "Directory for the disk tier of the KV cache: preempted requests "
                  "swap their blocks there when the host tier is full or absent and writing "
                  "and reading them is predicted cheaper than recomputing, and evicted "
                  "prefix-cache blocks spill there for later reloads (a fresh subdirectory "
                  "per engine, removed at shutdown; unset = no disk tier)."},
    )
    kv_offload_disk_blocks: int = field(
        default=1024,
        metadata={"help": "Disk tier budget in KV blocks (with --kv-offload-dir); swapped "
                  "requests take precedence over spilled prefix blocks, which are "
                  "evicted least recently used first."},
    )
    kv_offload_prefix_spill: bool = field(
        default=True,
        metadata={"help": "Spill evicted prefix-cache blocks to the disk tier and reload them "
                  "on a later hit (with --kv-offload-dir and prefix caching)."},
    )

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, minimum=1)
        if self.num_blocks is not None:
            _require_int("num_blocks", self.num_blocks, minimum=1)
        if self.kv_cache_memory_bytes is not None:
            _require_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, minimum=1)
        fraction = self.kv_cache_memory_fraction
        if fraction is not None and (isinstance(fraction, bool)
                                     or not isinstance(fraction, (int, float))
                                     or not 0 < fraction <= 1):
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 1], got {fraction!r}")
        _require_int("num_swap_blocks", self.num_swap_blocks, minimum=0)
        _require_int("kv_offload_disk_blocks", self.kv_offload_disk_blocks, minimum=1)
        if self.kv_offload_dir is not None and (
                not isinstance(self.kv_offload_dir, str) or not self.kv_offload_dir):
            raise ValueError(f"kv_offload_dir must be a directory path, got "
                             f"{self.kv_offload_dir!r}")
        if not isinstance(self.kv_offload_prefix_spill, bool):
            raise ValueError(f"kv_offload_prefix_spill must be a bool, got "
                             f"{self.kv_offload_prefix_spill!r}")
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
