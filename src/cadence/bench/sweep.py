"""`cadence sweep`: the same workload under a grid of scheduler settings, each on a fresh
`cadence serve` subprocess; writes sweep.json, sweep.md, sweep_map.png and one bench result per
setting (in a sub-folder named after the setting)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cadence.bench.bench import BenchError, prepare_workload, run_bench
from cadence.bench.config import BenchConfig
from cadence.bench.environment import describe_environment
from cadence.bench.report import config_json, ms, write_json
from cadence.bench.schema import SWEEP_SCHEMA_VERSION, validate_sweep
from cadence.bench.server_process import ServerProcess, ServerStartError, ServeSetting, free_port, serve_command
from cadence.bench.sweep_analysis import choose_setting, pareto_front, summarize_setting
from cadence.bench.sweep_plot import plot_sweep_map

POLICIES = ("eager", "chunked")


@dataclass(frozen=True)
class SweepConfig:
    """The grid. Chunk caps apply to the chunked policy only (eager admits prompts whole), so
    eager gets one setting per budget."""

    policies: tuple[str, ...] = POLICIES
    budgets: tuple[int, ...] = (64, 256, 512)
    chunk_caps: tuple[int, ...] = (0,)
    serve_args: tuple[str, ...] = ()
    port: int = 0
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise ValueError(f"unknown policies {bad}; choose from {', '.join(POLICIES)}")
        if not self.budgets or any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets must be positive token counts, got {self.budgets}")
        if not self.chunk_caps or any(c < 0 for c in self.chunk_caps):
            raise ValueError(f"chunk caps must be >= 0 (0 = no cap), got {self.chunk_caps}")

    def settings(self) -> list[ServeSetting]:
        grid = []
        for policy in self.policies:
            for budget in self.budgets:
                for cap in (self.chunk_caps if policy == "chunked" else (0,)):
                    if cap > budget:
                        continue  # a cap above the budget is the same as no cap
                    s = ServeSetting(policy, budget, cap)
                    if s not in grid:
                        grid.append(s)
        return grid


# (config, out_dir, workload) -> bench result.
BenchRunner = Callable[..., dict[str, Any]]


def run_sweep(base: BenchConfig, sweep: SweepConfig, out_dir: str | None,
              bench: BenchRunner = run_bench, launch=None) -> dict[str, Any]:
    """Run every setting; a setting whose server fails to start is recorded as failed.

    `launch(setting, port, log_path)` returns a context manager with `.url` (default: a
    `cadence serve` subprocess); tests pass a fake.
    """
    launch = launch or _launch_cadence(sweep)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)  # fail before starting servers, not after
    log_root = out_dir or tempfile.mkdtemp(prefix="cadence-sweep-")  # server logs always kept
    workload = prepare_workload(base)  # once: the same requests for every setting
    rows = []
    for setting in sweep.settings():
        port = sweep.port or free_port()
        sub_dir = os.path.join(out_dir, setting.name) if out_dir else None
        log_path = os.path.join(log_root, setting.name, "server.log")
        fields = dataclasses.asdict(setting)
        try:
            with launch(setting, port, log_path) as server:
                cfg = dataclasses.replace(base, client=dataclasses.replace(base.client, url=server.url),
                                          label=setting.name)
                result = bench(cfg, sub_dir, workload)
            rows.append(summarize_setting(setting.name, fields, result))
        except (ServerStartError, BenchError, OSError) as exc:
            rows.append({"name": setting.name, **fields, "status": "failed", "error": str(exc)[-2000:]})
    limits = base.analysis.slo.limits()
    result = {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "kind": "sweep",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {"sweep": dataclasses.asdict(sweep), "bench": config_json(base),
                   "workload": base.workload.name, "slo": limits},
        "environment": describe_environment(),
        "axes": {"x": "p50 TTFT of long prompts (s)", "y": "p99 ITL of interfered streams (s)",
                 "size_colour": "output tokens/s"},
        "settings": rows,
        "pareto": pareto_front(rows),
        "choice": choose_setting(rows, limits),
    }
    validate_sweep(result)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, "sweep.json"), result)
        plot_sweep_map(result, os.path.join(out_dir, "sweep_map.png"))
        with open(os.path.join(out_dir, "sweep.md"), "w", encoding="utf-8") as f:
            f.write(sweep_markdown(result))
    return result


def _launch_cadence(sweep: SweepConfig):
    def launch(setting: ServeSetting, port: int, log_path: str) -> ServerProcess:
        return ServerProcess(serve_command(setting, port, sweep.serve_args), port, log_path, sweep.startup_timeout_s)

    return launch


def sweep_markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"# cadence sweep: {cfg['workload']}",
        "",
        f"SLO: {cfg['slo'] or 'none'}; created {result['created_at']} on {result['environment']['host']} "
        f"({result['environment']['cpu_count']} CPUs).",
        "",
        "| setting | TTFT long p50 (ms) | ITL interfered p99 (ms) | ITL other p99 (ms) | TTFT p99 (ms) | ITL p99 (ms) | out tok/s | goodput req/s | failed | Pareto |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["settings"]:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | server failed: {r['error'].splitlines()[0][:80]} |  |  |  |  |  |  |  |  |")
            continue
        lines.append(
            f"| {r['name']} | {ms(r['x_ttft_long_p50'])} | {ms(r['y_itl_interfered_p99'])} | "
            f"{ms(r['itl_other']['p99'])} | {ms(r['p99']['ttft'])} | {ms(r['p99']['itl'])} | "
            f"{r['output_tps']:.1f} | {r['goodput_rps']:.2f} | {r['failed_requests']} | "
            f"{'yes' if r['name'] in result['pareto'] else ''} |"
        )
    choice = result["choice"]
    lines += ["", f"Pareto front (lower TTFT of long prompts and lower p99 ITL of interfered streams): "
              f"{', '.join(result['pareto']) or 'none'}.", ""]
    lines.append(f"Chosen: **{choice['name']}**: {choice['reason']}." if choice else "No setting ran.")
    lines += ["", "![sweep map](sweep_map.png)", ""]
    return "\n".join(lines)
