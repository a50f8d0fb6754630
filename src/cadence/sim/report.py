"""The comparison as a rich table (and as plain dicts for --json)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from cadence.sim.metrics import SimSummary


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def comparison_table(summaries: Sequence[SimSummary], title: str = "") -> Table:
    table = Table(title=title or None, show_lines=False)
    table.add_column("policy")
    table.add_column("streams' max gap\nduring doc prefill (ms)", justify="right")
    table.add_column("stream ITL\np50 (ms)", justify="right")
    table.add_column("stream ITL\np99 (ms)", justify="right")
    table.add_column("doc TTFT (s)", justify="right")
    table.add_column("throughput\n(out tok/s)", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("decode steps\nover target", justify="right")
    for s in summaries:
        over = "-"
        if s.decode_steps_over_target is not None:
            over = f"{s.decode_steps_over_target}/{s.num_decode_steps}"
        table.add_row(
            s.label,
            _ms(s.stream_max_gap_during_doc_s),
            _ms(s.stream_itl_p50_s),
            _ms(s.stream_itl_p99_s),
            _s(s.doc_ttft_s),
            f"{s.output_tokens_per_s:.0f}",
            str(s.num_steps),
            over,
        )
    return table


def summaries_as_dicts(summaries: Sequence[SimSummary]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in summaries]
