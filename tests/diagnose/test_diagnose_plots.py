"""diagnose's plots read right: prompt buckets in length order, what-if labels apart."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg

from cadence.diagnose.plots import causes_figure, whatif_figure
from cadence.diagnose.replay import Outcome, Recommendation, Setting


def test_interference_buckets_are_in_length_order_not_string_order():
    fig = causes_figure({"257-1024": 0.3, "1-64": 0.1, ">4096": 0.2, "65-256": 0.05,
                         "1025-4096": 0.4})
    FigureCanvasAgg(fig).draw()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["1-64", "65-256", "257-1024", "1025-4096", ">4096"]


def _outcome(budget, gap_ms, ttft_ms, meets=True):
    return Outcome(Setting("chunked", budget), {"max_gap_s": gap_ms / 1000,
                                                "ttft_p99_s": ttft_ms / 1000}, meets_slo=meets)


def test_whatif_labels_do_not_overlap_when_points_coincide():
    # Eight settings on almost the same point: the bug drew their names on top of each other.
    candidates = [_outcome(64 * (k + 1), 50 + 0.01 * k, 300 + 0.01 * k) for k in range(8)]
    measured = Outcome(None, {"max_gap_s": 0.05, "ttft_p99_s": 0.3})
    rec = Recommendation({"itl": 0.1}, False, "linear", measured, None, {}, candidates,
                         candidates[0])
    fig = whatif_figure(rec)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    names = {c.setting.name for c in candidates}
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts if t.get_text() in names]
    assert len(boxes) == len(candidates)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), "two setting names overlap"
