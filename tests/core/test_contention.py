"""The per-machine contention cache (core/contention.py): what an engine's startup probe or
`cadence sim --calibrate` measured is what later engines and simulations read back."""

from __future__ import annotations

import pytest

from cadence.core.contention import (
    Contention,
    cache_path,
    latest_for_machine,
    load_cached,
    machine_key,
    save_cached,
)


def test_measurements_round_trip_by_machine_key(tmp_path, monkeypatch):
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    key = machine_key(2, "avx2", "tiny")
    assert load_cached(key) is None and latest_for_machine(2) is None
    save_cached(key, Contention(1.3, 1.1, num_cores=2, measured_at=100.0))
    save_cached(machine_key(2, "avx512", "tiny"), Contention(1.6, 1.2, num_cores=2,
                                                             measured_at=200.0))
    got = load_cached(key)
    assert (got.decode, got.prefill, got.num_cores) == (1.3, 1.1, 2)
    assert got.source.startswith("cached")
    # The simulator's pick: the latest for this CPU and core count, whatever the tier.
    assert latest_for_machine(2).decode == 1.6
    assert latest_for_machine(4) is None
    assert cache_path().startswith(str(tmp_path))


def test_a_corrupt_cache_reads_as_unmeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    (tmp_path / "contention.json").write_text("{not json")
    assert load_cached(machine_key(2, "avx2", "m")) is None
    with pytest.raises(ValueError):
        Contention(0.0, 1.0, num_cores=2)
