"""Starting `cadence.cli` processes (workers, routers) on free loopback ports, in parallel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_harness import free_port

STARTUP_TIMEOUT_S = 300.0


@dataclass
class Proc:
    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def metrics(self) -> dict[str, float]:
        resp = httpx.get(self.url + "/metrics", timeout=10)
        resp.raise_for_status()
        out = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                  if k != "model_name")
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def kill9(self) -> None:
        """kill -9 of the whole worker: its engine process(es), then its server process."""
        for pid in self.children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def children(self) -> list[int]:
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(tmp_dir: str, *args: str, env: dict[str, str] | None = None,
          port: int | None = None) -> Proc:
    port = port or free_port()
    cmd = [sys.executable, "-m", "cadence.cli", *args, "--port", str(port),
           "--log-level", "warning"]
    log_path = os.path.join(tmp_dir, f"{args[0]}-{port}.log")
    log = open(log_path, "w")  # noqa: SIM115 - owned by the child
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Proc(proc, f"http://127.0.0.1:{port}", log_path)


def wait_all(procs: list[Proc], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        while True:
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.url} exited with {p.proc.returncode}:\n{p.log()}")
            try:
                if httpx.get(p.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                for q in procs:
                    q.stop(signal.SIGKILL)
                raise RuntimeError(f"{p.url} not healthy after {timeout_s}s:\n{p.log()}")
            time.sleep(0.2)


def worker_args(model_dir: str, role: str, *extra: str) -> list[str]:
    return ["serve", "--model", model_dir, "--dtype", "float32", "--device", "cpu",
            "--engine-threads", "1", "--num-kv-blocks", "512", "--block-size", "4",
            "--max-num-batched-tokens", "64", "--role", role, *extra]
