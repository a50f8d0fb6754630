"""Server /metrics samples joined onto prefill windows and requests."""

from __future__ import annotations

from cadence.bench.interference import PrefillWindow
from cadence.bench.timeline import join_timeline

from .records_factory import make_record

SAMPLES = [
    {"t": 0.0, "num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0, "num_preemptions_total": 0},
    {"t": 0.9, "num_requests_running": 2, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.1, "num_preemptions_total": 0},
    {"t": 1.5, "num_requests_running": 3, "num_requests_waiting": 1, "kv_cache_usage_perc": 0.6, "num_preemptions_total": 1},
    {"t": 2.5, "num_requests_running": 1, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.2, "num_preemptions_total": 2},
]


def test_window_gets_the_peaks_and_preemptions_seen_while_open():
    doc = make_record(9, 1.0, [(2.0, 1)], prompt_tokens=2000)
    joined = join_timeline([doc], [PrefillWindow(9, 1.0, 2.0)], SAMPLES)
    (w,) = joined["windows"]
    # Samples at 0.9 (state when it opened) and 1.5 (inside); 2.5 is after it closed.
    assert w["samples"] == 2
    assert w["max_num_requests_running"] == 3 and w["max_num_requests_waiting"] == 1
    assert w["max_kv_cache_usage_perc"] == 0.6
    assert w["preemptions"] == 1


def test_request_gets_the_state_last_scraped_before_send_and_first_token():
    rec = make_record(0, 1.0, [(2.6, 1)])
    (r,) = join_timeline([rec], [], SAMPLES)["requests"]
    assert r["at_send"]["t"] == 0.9 and r["at_first_token"]["t"] == 2.5
    early = make_record(1, -0.5, [])
    (e,) = join_timeline([early], [], SAMPLES)["requests"]
    assert e["at_send"] is None and e["at_first_token"] is None


def test_no_samples_no_join():
    rec = make_record(0, 0.0, [(0.1, 1)])
    assert join_timeline([rec], [PrefillWindow(0, 0.0, 0.1)], []) == {
        "kv_events": [], "windows": [], "requests": []}


def test_kv_offload_counters_become_timeline_marks_and_window_counts():
    samples = [
        {"t": 0.0, "kv_blocks_swapped_out_total": 0, "kv_blocks_swapped_out_disk_total": 0,
         "prefix_cache_blocks_reloaded_total": 0},
        {"t": 1.2, "kv_blocks_swapped_out_total": 6, "kv_blocks_swapped_out_disk_total": 0,
         "prefix_cache_blocks_reloaded_total": 0},
        {"t": 1.8, "kv_blocks_swapped_out_total": 6, "kv_blocks_swapped_out_disk_total": 4,
         "prefix_cache_blocks_reloaded_total": 3},
        {"t": 3.0, "kv_blocks_swapped_out_total": 6, "kv_blocks_swapped_out_disk_total": 4,
         "prefix_cache_blocks_reloaded_total": 3},
    ]
    doc = make_record(9, 1.0, [(2.0, 1)], prompt_tokens=2000)
    joined = join_timeline([doc], [PrefillWindow(9, 1.0, 2.0)], samples)
    assert joined["kv_events"] == [
        {"t": 1.2, "kind": "swap_out_host", "blocks": 6},
        {"t": 1.8, "kind": "prefix_reload_disk", "blocks": 3},
        {"t": 1.8, "kind": "swap_out_disk", "blocks": 4},
    ]
    (w,) = joined["windows"]
    assert (w["swap_out_host"], w["swap_out_disk"], w["prefix_reload_disk"]) == (6, 4, 3)


def test_the_scraper_reads_the_kv_offload_counters():
    from cadence.bench.metrics_scraper import parse_metrics
    from cadence.telemetry.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    metrics.update_engine_stats({"num_blocks_disk_swapped_out_total": 5,
                          "num_prefix_blocks_reloaded_total": 2,
                          "num_blocks_swapped_in_total": 7})
    found = parse_metrics(metrics.render().decode())
    assert found["kv_blocks_swapped_out_disk_total"] == 5
    assert found["prefix_cache_blocks_reloaded_total"] == 2
    assert found["kv_blocks_swapped_in_total"] == 7
