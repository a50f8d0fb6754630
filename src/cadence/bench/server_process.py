"""Start `cadence serve` as a subprocess for one scheduler setting and wait until it is healthy."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ServeSetting:
    """One point of the sweep grid (names follow vLLM's knobs)."""

    policy: str
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0

    @property
    def name(self) -> str:
        cap = f"-c{self.long_prefill_token_threshold}" if self.long_prefill_token_threshold else ""
        return f"{self.policy}-b{self.max_num_batched_tokens}{cap}"


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message has its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cli(args: list[str], log_path: str, timeout_s: float = 900.0) -> tuple[subprocess.Popen, str]:
    """Start `python -m cadence.cli ARGS --port P` (any subcommand that serves /health: serve,
    router) with its output in `log_path`; return (process, base URL) once /health answers 200.
    For benchmarks that keep the process across phases and stop it themselves. Idle OpenMP threads
    sleep (OMP_WAIT_POLICY=PASSIVE), as the server sets for itself, so they do not spin on cores
    the load generator shares."""
    port = free_port()
    cmd = [sys.executable, "-m", "cadence.cli", *args, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"{args[0]} exited; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise ServerStartError(f"{args[0]} not ready after {timeout_s:.0f} s; see {log_path}")


def serve_command(setting: ServeSetting, port: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "cadence.cli", "serve",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--policy", setting.policy,
        "--max-num-batched-tokens", str(setting.max_num_batched_tokens),
        "--long-prefill-token-threshold", str(setting.long_prefill_token_threshold),
        *extra_args,
    ]


class ServerProcess:
    """Context manager: start the server, wait for GET /health == 200, stop it on exit."""

    def __init__(self, command: list[str], port: int, log_path: str, startup_timeout_s: float = 180.0):
        self.command = command
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        self._log = open(self.log_path, "wb")
        # Own process group, so stopping it also stops the engine process it spawns.
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise ServerStartError(f"server not healthy after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()

    def __exit__(self, *exc) -> None:
        self.stop()
