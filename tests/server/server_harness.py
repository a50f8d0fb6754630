"""Starting a real `cadence serve` subprocess on a free localhost port, and reading it back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_FACTORY = "server_fake_engine:build_fake_engine"
STARTUP_TIMEOUT_S = 180.0


# Generous: a loaded CI host may take long over a request; a hang still ends the test.
CLIENT_TIMEOUT_S = 300.0


def openai_client(server: "RunningServer", api_key: str = "EMPTY",
                  timeout: float = CLIENT_TIMEOUT_S):
    """The official `openai` client on a server's /v1, without retries: a test sees exactly
    what the server answered (a retry would hide an error and send a request twice)."""
    import openai

    return openai.OpenAI(base_url=server.v1, api_key=api_key, max_retries=0, timeout=timeout)


def openai_error(resp: httpx.Response, status: int) -> dict:
    """The `error` object of an OpenAI-format error answer with this status."""
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    proc: subprocess.Popen
    base_url: str
    api_key: str | None
    log_path: str

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """/metrics parsed by prometheus_client: {'name{label=value,...}': value}."""
        resp = httpx.get(self.base_url + "/metrics", headers=self.headers(), timeout=10)
        resp.raise_for_status()
        samples = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                  if k != "model_name")
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(tmp_dir: str, *args: str, api_key: str | None = None,
                 env: dict[str, str] | None = None) -> RunningServer:
    port = free_port()
    cmd = [sys.executable, "-m", "cadence.cli", "serve", "--port", str(port),
           "--log-level", "warning", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **(env or {}),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    log_path = os.path.join(tmp_dir, f"server-{port}.log")
    log = open(log_path, "w")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(proc, f"http://127.0.0.1:{port}", api_key, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log()}")


def tiny_model_args(model_dir: str, *extra: str) -> list[str]:
    return ["--model", model_dir, "--dtype", "float32", "--device", "cpu",
            "--engine-threads", "2", "--num-kv-blocks", "2048", *extra]


def fake_engine_args(**engine: object) -> list[str]:
    return ["--engine-factory", FAKE_FACTORY, "--engine-config-json", json.dumps(engine)]


