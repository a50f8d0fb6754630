"""DisaggConfig: a worker's role in disaggregated serving and its KV transfer settings."""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("prefill", "decode", "both")


@dataclass(frozen=True)
class DisaggConfig:
    role: str = field(default="both", metadata={
        "help": "prefill: computes prompts and the first token and serves their KV to decode "
                "workers; decode: pulls prefilled KV and decodes; both: either (every worker "
                "also serves whole requests, colocated).", "choices": ROLES})
    kv_transfer_address: str | None = field(default=None, metadata={
        "help": "Where this worker serves its leased KV blocks: tcp://HOST:PORT (PORT 0 picks "
                "one) or ipc://PATH. Default: an ipc socket in the temp folder."})
    engine_id: str | None = field(default=None, metadata={
        "help": "This engine's id in KV handoffs (default: random)."})
    kv_lease_timeout_s: float = field(default=30.0, metadata={
        "help": "Seconds a prefilled request's blocks stay leased without the decode side's "
                "acknowledgement before they are freed."})
    kv_transfer_timeout_s: float = field(default=10.0, metadata={
        "help": "Seconds a decode worker waits for a prefill worker's KV before the request "
                "ends with an error."})

    kv_events_address: str | None = field(default="tcp://127.0.0.1:0", metadata={
        "help": "Where this worker publishes its prefix cache's block hashes (ZeroMQ PUB, for "
                "cache-aware routers): tcp://HOST:PORT (PORT 0 picks one; its port is the "
                "kv_events_port gauge of /metrics); empty: no events."})

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.kv_lease_timeout_s <= 0 or self.kv_transfer_timeout_s <= 0:
            raise ValueError("KV lease and transfer timeouts must be > 0")

    @property
    def serves_prefill(self) -> bool:
        return self.role in ("prefill", "both")

    @property
    def serves_decode(self) -> bool:
        return self.role in ("decode", "both")
