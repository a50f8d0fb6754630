"""PausePoints' row blocks: even sizes, and sized per op group from the time its previous
group of the same kind took (model/pause_points.py), on a fake clock."""

from __future__ import annotations

from cadence.model import pause_points
from cadence.model.pause_points import PausePoints


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _sizes(slices: list[slice]) -> list[int]:
    return [s.stop - s.start for s in slices]


def _run_group(points: PausePoints, clock: Clock, total: int, kind: str, s_per_row: float) -> list[int]:
    """An op group of `total` rows whose rows each take `s_per_row`, closed by a layer boundary."""
    sizes = _sizes(points.row_slices(total, kind))
    for n, size in enumerate(sizes):
        if n:
            points.inside()
        clock.t += size * s_per_row
    points()
    return sizes


def test_blocks_are_even_and_cover_the_rows(monkeypatch):
    monkeypatch.setattr(pause_points.time, "perf_counter", Clock())
    points = PausePoints(lambda: None, row_block=100)
    slices = points.row_slices(250, "mlp")
    assert _sizes(slices) == [84, 84, 82]
    assert [s.start for s in slices] == [0, 84, 168] and slices[-1].stop == 250
    assert _sizes(points.row_slices(60, "mlp")) == [60]
    assert points.split_rows


def test_blocks_follow_the_latest_group_of_their_kind(monkeypatch):
    clock = Clock()  # times in powers of two: every sum and quotient below is exact
    monkeypatch.setattr(pause_points.time, "perf_counter", clock)
    hooks = []
    points = PausePoints(lambda: hooks.append(clock.t), row_block=100, block_s=2**-7, min_rows=8)
    # Before a measurement: row_block (evened out over the rows).
    assert _run_group(points, clock, 256, "attention", 2**-12) == [86, 86, 84]
    assert points.s_per_row["attention"] == 2**-12
    # The MLP has no measurement of its own yet; attention's does not size it.
    assert _run_group(points, clock, 256, "mlp", 2**-14) == [86, 86, 84]
    # Next layer: each kind's blocks take block_s at its own rate (32 and 128 rows).
    assert _run_group(points, clock, 256, "attention", 2**-12) == [32] * 8
    assert _run_group(points, clock, 256, "mlp", 2**-14) == [128, 128]
    # A slow group (a preempted block, a longer context) shrinks the next one, not below min_rows.
    assert _run_group(points, clock, 256, "attention", 2**-8) == [32] * 8
    assert _sizes(points.row_slices(256, "attention")) == [8] * 32
    # No step was due: the hook ran at the op groups' ends only.
    assert len(hooks) == 5
