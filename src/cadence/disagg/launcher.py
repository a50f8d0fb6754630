"""`cadence serve --disagg P:D` and `--data-parallel-size N`: P prefill and D decode workers, or
N replicas (`--role both`, each serving whole requests), on this machine (processes, or Ray
actors with `--distributed-executor-backend ray`) and the router in front on --port.

Each worker is a whole `cadence serve --role ...` (its own HTTP server and engine process) on a
free loopback port, with an equal share of the cores (`--engine-threads`). The router runs in
this process; when it stops, the workers are stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from cadence.disagg.config import DisaggConfig
from cadence.engine.engine_process import EngineProcessConfig
from cadence.server.config import ServerConfig


def parse_disagg(text: str) -> tuple[int, int]:
    """'P:D' -> (P, D), both >= 1."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--disagg takes P:D (e.g. 1:1), got {text!r}") from None
    if p < 1 or d < 1:
        raise ValueError(f"--disagg needs at least one worker of each role, got {text!r}")
    return p, d


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class WorkerSpec:
    role: str
    server: ServerConfig
    process: EngineProcessConfig

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    def to_json(self, log_level: str) -> str:
        return json.dumps({"server": dataclasses.asdict(self.server),
                           "process": json.loads(self.process.to_json()),
                           "log_level": log_level})


def worker_trace_path(path: str | None, index: int) -> str | None:
    """Worker `index`'s own `--trace` file: FILE.jsonl -> FILE.<index>.jsonl (N engines writing
    one file would truncate each other's lines); None stays None."""
    if not path:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.{index}{ext}"


def worker_process_config(process: EngineProcessConfig, disagg: DisaggConfig,
                          threads: int | None, index: int | None = None) -> EngineProcessConfig:
    """The engine process config of a worker with `disagg`'s role; worker `index` of a
    launched set writes its own trace file (None: a lone worker keeps the path given)."""
    engine = dict(process.engine_config)
    engine["disagg"] = dataclasses.asdict(disagg)
    if index is not None:
        engine["trace_path"] = worker_trace_path(engine.get("trace_path"), index)
    factory = process.engine_factory
    if factory == EngineProcessConfig.engine_factory:  # the default LLMEngine
        factory = "cadence.disagg.worker:build_disagg_engine"
    return dataclasses.replace(process, engine_config=engine, engine_factory=factory,
                               engine_threads=threads)


def worker_specs(num_prefill: int, num_decode: int, server: ServerConfig,
                 process: EngineProcessConfig, disagg: DisaggConfig,
                 host: str = "127.0.0.1", num_replicas: int = 0) -> list[WorkerSpec]:
    threads = max(1, (os.cpu_count() or 1) // (num_prefill + num_decode + num_replicas))
    specs = []
    for role, count in (("prefill", num_prefill), ("decode", num_decode),
                        ("both", num_replicas)):
        for _ in range(count):
            worker_server = dataclasses.replace(server, host=host, port=free_port(host),
                                                engine_threads=threads)
            cfg = dataclasses.replace(disagg, role=role)
            specs.append(WorkerSpec(role, worker_server,
                                    worker_process_config(process, cfg, threads, len(specs))))
    return specs


def start_worker_process(spec: WorkerSpec, log_level: str = "warning") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "cadence.disagg.worker_main"],
                            stdin=subprocess.PIPE)
    proc.stdin.write(spec.to_json(log_level).encode())
    proc.stdin.close()
    return proc


def wait_healthy(url: str, alive, timeout_s: float = 900.0) -> None:
    """Until GET url/health answers 200; raises if `alive()` turns False or on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"worker {url} exited during startup")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"worker {url} not healthy after {timeout_s:.0f}s")


def stop_processes(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run_disagg(args: Any, server: ServerConfig, process: EngineProcessConfig,
               disagg: DisaggConfig) -> int:
    """Start the workers, run the router on server.host:server.port until it stops."""
    from cadence.disagg.router.app import run_router
    from cadence.disagg.router.config import RouterConfig

    num_prefill, num_decode = parse_disagg(args.disagg) if args.disagg else (0, 0)
    num_replicas = getattr(args, "data_parallel_size", None) or 0
    if num_replicas < 0 or num_prefill + num_decode + num_replicas == 0:
        raise ValueError("--data-parallel-size takes N >= 1")
    specs = worker_specs(num_prefill, num_decode, server, process, disagg,
                         num_replicas=num_replicas)
    backend = getattr(args, "distributed_executor_backend", None) or "mp"
    handles: list[Any] = []
    try:
        if backend == "ray":
            from cadence.disagg.ray_backend import start_ray_workers

            handles = start_ray_workers(specs, args.log_level,
                                        resource=getattr(args, "ray_worker_resource", None))
            urls = [h.url for h in handles]
            specs = [dataclasses.replace(s, role=h.role) for s, h in zip(specs, handles)]
        else:
            procs = [start_worker_process(s, args.log_level) for s in specs]
            handles = procs
            for spec, proc in zip(specs, procs):
                wait_healthy(spec.url, lambda p=proc: p.poll() is None)
            urls = [s.url for s in specs]
        roles = [s.role for s in specs]
        cfg = RouterConfig(
            prefill_urls=tuple(u for u, r in zip(urls, roles) if r == "prefill"),
            decode_urls=tuple(u for u, r in zip(urls, roles) if r == "decode"),
            worker_urls=tuple(u for u, r in zip(urls, roles) if r == "both"),
            host=server.host, port=server.port, routing_policy=args.routing_policy,
            cache_load_weight=getattr(args, "cache_load_weight", 0.25), api_key=server.api_key)
        # uvicorn re-raises SIGTERM once it has stopped: as an exception it reaches the
        # `finally` below, which stops the workers (the default action would skip it).
        signal.signal(signal.SIGTERM, _exit_on_signal)
        print(f"[cadence] router on http://{server.host}:{server.port}: prefill "
              f"{list(cfg.prefill_urls)}, decode {list(cfg.decode_urls)}, replicas "
              f"{list(cfg.worker_urls)}, policy "
              f"{cfg.routing_policy}", file=sys.stderr, flush=True)
        run_router(cfg, log_level=args.log_level)
    finally:
        if backend == "ray":
            from cadence.disagg.ray_backend import stop_ray_workers

            stop_ray_workers(handles)
        else:
            stop_processes(handles)
    return 0
