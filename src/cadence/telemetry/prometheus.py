"""Prometheus collectors with vLLM-like names under the `cadence:` prefix.

One `PrometheusMetrics` per app, on its own CollectorRegistry (no global state), fed with plain
records that the engine process ships (see cadence.engine.engine_process: finished-request
records from the telemetry recorder, step token counts, scheduler stats):

- histograms (seconds): time_to_first_token, inter_token_latency, time_per_output_token,
  e2e_request_latency, request_queue_time, request_prefill_time, request_decode_time;
  iteration_tokens (tokens per step); request_prompt_tokens / request_generation_tokens.
- counters: request_success_total{finished_reason}, prompt_tokens_total (prompts whose prefill
  completed), generation_tokens_total, iteration_prefill_tokens_total,
  iteration_decode_tokens_total, num_preemptions_total, prefix_cache_queries_total,
  prefix_cache_hits_total (the last three are the scheduler's cumulative totals).
- gauges: num_requests_running, num_requests_waiting, kv_cache_usage_perc (0..1, as vLLM),
  kv_cache_blocks_used / _free / _total / _cached; with the slo policy itl_target_seconds and
  itl_target_reachable_seconds; num_interjections_total; num_swap_preemptions_total, kv_blocks_swapped_out_total,
  kv_blocks_swapped_in_total (swap preemption); num_disk_swap_preemptions_total,
  kv_blocks_swapped_out_disk_total, kv_blocks_swapped_in_disk_total,
  prefix_cache_blocks_spilled_total, prefix_cache_blocks_reloaded_total,
  kv_offload_failures_total, kv_offload_disk_blocks_used / _total (the disk tier).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "cadence:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket edges (seconds), close to vLLM's.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# record key -> (metric suffix, help, buckets)
_REQUEST_HISTOGRAMS = (
    ("ttft", "time_to_first_token_seconds", "Arrival to first output token.", TTFT_BUCKETS),
    ("tpot", "time_per_output_token_seconds", "(E2E - TTFT) / (output tokens - 1) per request.",
     ITL_BUCKETS),
    ("e2e", "e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS),
    ("queue_time", "request_queue_time_seconds", "Arrival to first scheduled.", REQUEST_BUCKETS),
    ("prefill_time", "request_prefill_time_seconds", "First scheduled to first token.",
     REQUEST_BUCKETS),
    ("decode_time", "request_decode_time_seconds", "First token to finish.", REQUEST_BUCKETS),
)


class _EngineStatsCollector(Collector):
    """Gauges and cumulative counters read from the latest scheduler stats snapshot."""

    def __init__(self, model_name: str) -> None:
        self.stats: dict[str, Any] = {}
        self.engine_up = 1
        self.engine_restarts = 0
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        # Every series carries model_name, as vLLM's do, so vLLM dashboards' queries match.
        labels = ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, float(s.get(key, 0)))
            return family

        total = s.get("num_blocks_total", 0)
        used = s.get("num_blocks_used", 0)
        yield gauge("num_requests_running", "Requests in the running batch.",
                    s.get("num_running", 0))
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.",
                    s.get("num_waiting", 0))
        yield gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).",
                    used / total if total else 0.0)
        yield gauge("kv_cache_blocks_used", "KV cache blocks held by requests.", used)
        yield gauge("kv_cache_blocks_free", "KV cache blocks free (cached ones included).",
                    s.get("num_blocks_free", 0))
        yield gauge("kv_cache_blocks_total", "KV cache blocks in the pool.", total)
        yield gauge("kv_cache_blocks_cached", "Free blocks still holding a reusable prefix.",
                    s.get("num_blocks_cached", 0))
        if s.get("itl_target_s") is not None:
            yield gauge("itl_target_seconds", "slo policy: the configured ITL target.",
                        s["itl_target_s"])
            reachable = s.get("itl_target_reachable_s")
            yield gauge("itl_target_reachable_seconds",
                        "slo policy: the ITL its mixed steps are predicted at when the target "
                        "is below what this machine reaches without slowing prefills by more "
                        "than --max-prefill-slowdown (= the target while it is reachable).",
                        reachable if reachable is not None else s["itl_target_s"])
        if s.get("split_decode_threads") is not None:  # --core-split
            yield gauge("core_split_prefill_threads", "--core-split: threads of the prefill "
                        "team in the current interval (0: colocated steps on every core).",
                        s["split_prefill_threads"])
            yield gauge("core_split_decode_threads", "--core-split: threads of the decode "
                        "team (every core while colocated).", s["split_decode_threads"])
            yield gauge("core_split_prefill_team_utilisation", "--core-split: share of the "
                        "latest window the prefill team computed.",
                        s.get("prefill_team_utilisation", 0.0))
            yield gauge("core_split_decode_team_utilisation", "--core-split: share of the "
                        "latest window the decode team (or a colocated step) computed.",
                        s.get("decode_team_utilisation", 0.0))
            yield counter("core_split_changes", "--core-split: changes of the split.",
                          "num_core_split_changes_total")
            if s.get("decode_contention") is not None:
                yield gauge("core_split_decode_contention", "--core-split: a decode step's "
                            "time per row beside a prefill over colocated, beyond the core "
                            "ratio (memory bandwidth both teams share).",
                            s["decode_contention"])
        yield gauge("engine_up", "1 while an engine process serves, 0 while it is restarting.",
                    self.engine_up)
        restarts = CounterMetricFamily(PREFIX + "engine_restarts",
                                       "Engine processes respawned after one died.",
                                       labels=labels)
        restarts.add_metric(values, float(self.engine_restarts))
        yield restarts
        yield counter("num_preemptions", "Preemptions since start.", "num_preemptions_total")
        yield counter("num_swap_preemptions", "Preemptions that swapped the request's KV to the "
                      "host tier instead of recomputing it.", "num_swap_preemptions_total")
        yield counter("num_interjections", "Steps of short prompts run between two layers of "
                      "a long step (--interject-short-prompts).", "num_interjections_total")
        yield counter("kv_blocks_swapped_out", "KV blocks copied to the host tier.",
                      "num_blocks_swapped_out_total")
        yield counter("kv_blocks_swapped_in", "KV blocks copied back from the host tier.",
                      "num_blocks_swapped_in_total")
        # The disk tier (--kv-offload-dir): swap preemptions to disk, prefix-cache spills and
        # reloads, the budget in use, and disk I/O failures that fell back to recompute.
        yield counter("num_disk_swap_preemptions", "Swap preemptions whose KV went to the "
                      "disk tier (a subset of num_swap_preemptions).",
                      "num_disk_swap_preemptions_total")
        yield counter("kv_blocks_swapped_out_disk", "KV blocks written to the disk tier by "
                      "swap preemption.", "num_blocks_disk_swapped_out_total")
        yield counter("kv_blocks_swapped_in_disk", "KV blocks read back from the disk tier by "
                      "swap preemption.", "num_blocks_disk_swapped_in_total")
        yield counter("prefix_cache_blocks_spilled", "Evicted prefix-cache blocks written to "
                      "the disk tier.", "num_prefix_blocks_spilled_total")
        yield counter("prefix_cache_blocks_reloaded", "Prefix-cache blocks reloaded from the "
                      "disk tier on a hit.", "num_prefix_blocks_reloaded_total")
        yield counter("kv_offload_failures", "Disk tier writes or reads that failed (the "
                      "request was recomputed instead).", "num_kv_offload_failures_total")
        yield gauge("kv_offload_disk_blocks_used", "Disk tier slots holding swapped or spilled "
                    "blocks.", s.get("num_disk_blocks_used", 0))
        yield gauge("kv_offload_disk_blocks_total", "Disk tier budget in blocks (0: no disk "
                    "tier).", s.get("num_disk_blocks_total", 0))
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      "prefix_cache_queries")
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                      "prefix_cache_hits")
        # Disaggregated serving (cadence.disagg); zero on a colocated engine.
        yield gauge("num_requests_waiting_for_kv",
                    "Prefilled requests waiting for blocks or for their KV transfer.",
                    s.get("num_waiting_for_kv", 0))
        yield gauge("kv_cache_blocks_leased",
                    "Blocks of finished prefills kept for a decode engine to pull.",
                    s.get("num_leased_blocks", 0))
        yield counter("kv_transfers", "KV loads completed (decode side).", "kv_transfers_total")
        yield counter("kv_transfer_bytes", "KV bytes pulled from prefill engines.",
                      "kv_transfer_bytes_total")
        yield counter("kv_transfer_seconds", "Time spent pulling KV (sum over requests).",
                      "kv_transfer_seconds_total")
        yield counter("kv_transfer_failures", "KV loads that failed (request ended in error).",
                      "kv_transfer_failures_total")
        yield counter("kv_leases_expired", "Prefill leases freed by expiry, not by an ack.",
                      "kv_leases_expired_total")
        yield gauge("kv_bytes_per_token", "KV cache bytes one token takes (all layers, K+V).",
                    s.get("kv_bytes_per_token", 0))
        yield gauge("kv_events_port", "TCP port of this worker's KV cache events (ZeroMQ "
                    "PUB of prefix block hashes, for cache-aware routers); 0: none.",
                    s.get("kv_events_port", 0))
        yield counter("kv_bytes_served", "KV bytes sent to decode engines (prefill side).",
                      "kv_bytes_served_total")


class PrometheusMetrics:
    """The server's metrics; `render()` gives the exposition text for /metrics."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        self._request_histograms = {
            key: Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)
            .labels(model_name)
            for key, name, doc, buckets in _REQUEST_HISTOGRAMS
        }
        self._itl = Histogram(PREFIX + "inter_token_latency_seconds",
                              "Gaps between consecutive output tokens of a request.", labels,
                              buckets=ITL_BUCKETS, registry=self.registry).labels(model_name)
        self._iteration_tokens = Histogram(
            PREFIX + "iteration_tokens_total", "Tokens computed per engine step.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry).labels(model_name)
        self._request_prompt_tokens = Histogram(
            PREFIX + "request_prompt_tokens", "Prompt tokens per finished request.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry).labels(model_name)
        self._request_generation_tokens = Histogram(
            PREFIX + "request_generation_tokens", "Output tokens per finished request.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry).labels(model_name)
        self._success = Counter(PREFIX + "request_success", "Finished requests by reason.",
                                labels + ["finished_reason"], registry=self.registry)
        self._prompt_tokens = Counter(PREFIX + "prompt_tokens",
                                      "Prompt tokens of requests whose prefill completed.", labels,
                                      registry=self.registry).labels(model_name)
        self._generation_tokens = Counter(PREFIX + "generation_tokens", "Generated tokens.",
                                          labels, registry=self.registry).labels(model_name)
        self._prefill_tokens = Counter(PREFIX + "iteration_prefill_tokens",
                                       "Prompt tokens computed by engine steps (recompute after "
                                       "preemption included).", labels,
                                       registry=self.registry).labels(model_name)
        self._decode_tokens = Counter(PREFIX + "iteration_decode_tokens",
                                      "Decode tokens computed by engine steps.", labels,
                                      registry=self.registry).labels(model_name)
        self._engine_stats = _EngineStatsCollector(model_name)
        self.registry.register(self._engine_stats)

    # ---- inputs (EngineMetricsSink)

    def record_request(self, record: Mapping[str, Any]) -> None:
        """A finished request's telemetry record (keys as engine_process.timeline_record)."""
        for key, hist in self._request_histograms.items():
            value = record.get(key)
            if value is not None:
                hist.observe(max(0.0, value))
        for gap in record.get("itl") or ():
            self._itl.observe(max(0.0, gap))
        self._success.labels(self.model_name, record.get("finish_reason") or "abort").inc()
        if record.get("ttft") is not None:
            self._prompt_tokens.inc(record.get("num_prompt_tokens", 0))
            self._request_prompt_tokens.observe(record.get("num_prompt_tokens", 0))
        self._request_generation_tokens.observe(record.get("num_output_tokens", 0))

    def record_iteration(self, num_steps: int, num_prefill_tokens: int,
                         num_decode_tokens: int) -> None:
        """Token counts of `num_steps` steps (one histogram sample per step when num_steps=1)."""
        if num_steps <= 0:
            return
        per_step = (num_prefill_tokens + num_decode_tokens) / num_steps
        for _ in range(num_steps):
            self._iteration_tokens.observe(per_step)
        self._prefill_tokens.inc(num_prefill_tokens)
        self._decode_tokens.inc(num_decode_tokens)

    def record_generated_tokens(self, num_tokens: int) -> None:
        self._generation_tokens.inc(num_tokens)

    def update_engine_stats(self, stats: Mapping[str, Any]) -> None:
        self._engine_stats.stats = dict(stats)

    def engine_down(self) -> None:
        """The engine died: its running/waiting requests and KV blocks are gone with it."""
        self._engine_stats.stats = {}
        self._engine_stats.engine_up = 0

    def engine_up(self, num_restarts: int) -> None:
        """A respawned engine serves again (its stats arrive with its batches)."""
        self._engine_stats.engine_up = 1
        self._engine_stats.engine_restarts = num_restarts

    # ---- output

    def render(self) -> bytes:
        return generate_latest(self.registry)
