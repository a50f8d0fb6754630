"""What the scheduler reports: per-request updates after a step, and its own counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)  # per request per step: see ScheduledChunk (plan.py)
class RequestUpdate:
    """A request's progress in one `Scheduler.update`: new tokens, and whether it finished."""

    req_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    # Why, when finish_reason == "error" (e.g. the request cannot fit the KV cache).
    error_message: str | None = None


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of the scheduler. Blocks: free + used == total; `num_blocks_cached` counts
    the free blocks that still hold a reusable prefix (a subset of free). Prefix-cache queries
    and hits are counted in tokens at each admission, as vLLM does."""

    num_running: int
    num_waiting: int
    num_blocks_total: int
    num_blocks_used: int
    num_blocks_free: int
    num_blocks_cached: int
    num_preemptions_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    # Disaggregation: decode-side requests whose prompt KV is queued or being loaded, and
    # prefill-side blocks kept under a lease for a decode engine to pull.
    num_waiting_for_kv: int = 0
    num_leased_blocks: int = 0
    # slo policy: the configured ITL target, and the step time its mixed steps are predicted
    # at when the prefill floor (not the target) sizes them (the target reachable here);
    # None for other policies / while the target is reachable.
    itl_target_s: float | None = None
    itl_target_reachable_s: float | None = None
    # Swap preemption (core/swap.py): preemptions that swapped instead of recomputing, and
    # blocks copied to the host tier and back.
    num_swap_preemptions_total: int = 0
    # Short prompts run between two layers of a long step (Scheduler.schedule_interjection).
    num_interjections_total: int = 0
    num_blocks_swapped_out_total: int = 0
    num_blocks_swapped_in_total: int = 0
    # The disk tier (core/disk_tier.py): swap preemptions and blocks that went to disk (a
    # subset of the swap preemptions above; the block counts are disk-only), prefix-cache
    # blocks spilled and reloaded, slots in use of the budget, and I/O failures that fell back
    # to recompute.
    num_disk_swap_preemptions_total: int = 0
    num_blocks_disk_swapped_out_total: int = 0
    num_blocks_disk_swapped_in_total: int = 0
    num_prefix_blocks_spilled_total: int = 0
    num_prefix_blocks_reloaded_total: int = 0
    num_disk_blocks_used: int = 0
    num_disk_blocks_total: int = 0
    num_kv_offload_failures_total: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def kv_cache_usage(self) -> float:
        return self.num_blocks_used / self.num_blocks_total
