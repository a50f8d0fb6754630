"""One `cadence bench` invocation: build the workload, run it, write JSON, Markdown and plots."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import httpx

from cadence.bench.client import auth_headers, served_model_name
from cadence.bench.config import ArrivalConfig, BenchConfig
from cadence.bench.plots import plot_run
from cadence.bench.report import build_result, markdown_summary, write_json
from cadence.bench.runner import RunOutcome, make_progress, run_workload
from cadence.bench.schema import validate_result
from cadence.bench.token_counter import load_token_counter
from cadence.bench.workloads import Workload, build_workload


class BenchError(RuntimeError):
    """The benchmark could not run at all (server unreachable, no model name, bad sizes)."""


def resolve_arrivals(arrival: ArrivalConfig, workload: Workload) -> list[tuple[str, ArrivalConfig]]:
    """(label, concrete arrival) for each run: one, or one per rate of a sweep."""
    kind = workload.default_arrival if arrival.kind == "auto" else arrival.kind
    if kind != "sweep":
        return [(kind, dataclasses.replace(arrival, kind=kind))]
    single = "poisson" if arrival.burstiness == 1.0 else "gamma"
    return [(f"rate_{rate:g}", dataclasses.replace(arrival, kind=single, rate=rate, rates=())) for rate in arrival.rates]


async def _preflight(http: httpx.AsyncClient, cfg: BenchConfig) -> dict[str, Any]:
    """Reach the server once before sending the workload; learn the model name if not given."""
    url = cfg.client.url.rstrip("/")
    try:
        resp = await http.get(url + "/v1/models", headers=auth_headers(cfg.client), timeout=10.0)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach the server at {cfg.client.url}: {type(exc).__name__}: {exc}") from exc
    model = cfg.client.model
    if model is None:
        if resp.status_code != 200:
            raise BenchError(f"GET {url}/v1/models answered HTTP {resp.status_code}; pass --model")
        try:
            model = await served_model_name(http, cfg.client)
        except (ValueError, httpx.HTTPError) as exc:
            raise BenchError(str(exc)) from exc
    return {"url": cfg.client.url, "model": model, "models_status": resp.status_code}


async def run_all(cfg: BenchConfig, workload: Workload) -> tuple[list[RunOutcome], dict[str, Any]]:
    timeout = httpx.Timeout(cfg.client.request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        server = await _preflight(http, cfg)
        runs = []
        progress = make_progress(cfg.progress)
        if progress is not None:
            progress.start()
        try:
            for label, arrival in resolve_arrivals(cfg.arrival, workload):
                # A sweep's bars say which setting they belong to.
                description = f"{cfg.label}: {label}" if cfg.label else label
                runs.append(await run_workload(http, cfg, server["model"], workload, arrival, label,
                                               progress, description))
        finally:
            if progress is not None:
                progress.stop()
    return runs, server


def prepare_workload(cfg: BenchConfig) -> Workload:
    """The requests `cfg` describes, counted with the configured tokenizer."""
    return build_workload(cfg.workload, load_token_counter(cfg.tokenizer, cfg.use_tokenizer))


def run_bench(cfg: BenchConfig, out_dir: str | None, workload: Workload | None = None) -> dict[str, Any]:
    """Run the benchmark; write result.json, summary.md and plots to out_dir (when given).
    `workload` may be passed pre-built (a sweep reuses one); it must come from `cfg.workload`."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)  # fail before the run, not after it
    workload = workload or prepare_workload(cfg)
    long_tokens = cfg.analysis.long_prompt_tokens or workload.long_prompt_tokens
    runs, server = asyncio.run(run_all(cfg, workload))
    result = build_result(cfg, workload, runs, long_tokens, server)
    validate_result(result)
    if out_dir:
        write_outputs(result, out_dir)
    return result


def write_outputs(result: dict[str, Any], out_dir: str) -> dict[str, list[str]]:
    os.makedirs(out_dir, exist_ok=True)
    plots = {}
    single = len(result["runs"]) == 1
    for run in result["runs"]:
        plots[run["label"]] = plot_run(run, out_dir, "" if single else f"{run['label']}_")
    write_json(os.path.join(out_dir, "result.json"), result)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown_summary(result, plots))
    return plots
