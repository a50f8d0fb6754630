"""RouterConfig: what `cadence router` (and `cadence serve --disagg`) is given."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("auto", "always", "never")


@dataclass(frozen=True)
class RouterConfig:
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    routing_policy: str = field(default="auto", metadata={
        "help": "auto: per request, disaggregate when the interference it avoids on the decode "
                "worker outweighs the measured handoff cost (prefill queue, KV transfer, extra "
                "hop); always: every request through a prefill worker; never: every request "
                "colocated on a decode worker.", "choices": POLICIES})
    # Prompts shorter than this are never handed off (auto); 0: the cost model decides alone.
    min_disagg_prompt_tokens: int = 0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 2.0
    # How long a worker that failed a connection is skipped.
    unhealthy_cooldown_s: float = 5.0
    # Scrape period of the workers' /metrics (queue depths, KV transfer counters).
    scrape_interval_s: float = 1.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.routing_policy not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}")
        if not self.decode_urls:
            raise ValueError("the router needs at least one decode worker (--decode URL)")
        if self.routing_policy == "always" and not self.prefill_urls:
            raise ValueError("--routing-policy always needs at least one --prefill worker")
