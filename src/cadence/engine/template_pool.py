"""TemplatePool: chat templates rendered in a small pool of persistent worker processes.

    admission thread --render()--> idle worker (template_worker.py, OS limits on CPU and memory)
                                   reply within the wall deadline, else the worker is killed
                                   and replaced; the request gets TemplateBudgetError (a 400)

Chat templates ship inside model files (or per request): untrusted code. In-process budgets
(chat_template.BoundedSandbox) catch what a template does through jinja's operators, but not
`~` concatenation, big-integer arithmetic or a loop over a long string; a process can be
limited by the OS and killed whatever it runs. The pool keeps the common case fast: workers
persist (a render costs a pipe round trip, not a process start), and it grows on demand up to
`max_workers`, so one request holding a worker for its whole budget never makes the others
wait. A worker that broke a budget (or died) is dropped and the next render starts a new one.
A render's wall-clock budget starts once its worker reported ready: a worker started on demand
on a loaded host (its imports at a busy core's leftovers) took seconds, and the first render
then broke a 2 s budget that its template never used.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cadence.engine.template_worker import HEADER, write_frame


@dataclass(frozen=True)
class TemplateBudget:
    """What one chat-template render may use (each enforced by the OS, see the module doc)."""

    cpu_seconds: float = field(default=5.0, metadata={
        "help": "CPU seconds one chat-template render may use (RLIMIT_CPU)."})
    wall_seconds: float = field(default=10.0, metadata={
        "help": "Seconds one render may take before its worker is killed."})
    memory_bytes: int = field(default=512 * 2**20, metadata={
        "help": "Bytes a render may grow its worker's address space by (RLIMIT_AS)."})

    @staticmethod
    def from_env() -> TemplateBudget:
        """Defaults, or CADENCE_TEMPLATE_CPU_S / _WALL_S / _MEMORY_MB when set (operators
        and tests tighten them without a new flag on every entry point)."""
        env = os.environ
        default = TemplateBudget()
        return TemplateBudget(
            cpu_seconds=float(env.get("CADENCE_TEMPLATE_CPU_S", default.cpu_seconds)),
            wall_seconds=float(env.get("CADENCE_TEMPLATE_WALL_S", default.wall_seconds)),
            memory_bytes=int(float(env.get("CADENCE_TEMPLATE_MEMORY_MB",
                                           default.memory_bytes / 2**20)) * 2**20))


class TemplateBudgetError(ValueError):
    """A render that broke one of its budgets: the client's template or messages (a 400)."""

    code = "chat_template_budget_exceeded"


class TemplateWorkerError(RuntimeError):
    """No worker could render (none could start, one crashed, all stayed busy): the server's
    state, not the request's (a 503)."""

    status = 503
    code = "chat_template_unavailable"


# Longest wait for a new worker's "ready" (imports and limits done): far beyond the fraction of a
# second it takes, for a loaded host; not charged to any render's budget.
WORKER_START_TIMEOUT_S = 60.0


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, budget: TemplateBudget) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cadence.engine.template_worker",
             str(budget.cpu_seconds), str(budget.memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            close_fds=True)
        self.fd = self.proc.stdout.fileno()

    def send(self, request: dict[str, Any]) -> None:
        write_frame(self.proc.stdin, request)

    def wait_ready(self, timeout_s: float = WORKER_START_TIMEOUT_S) -> None:
        """Until the worker reported ready; OSError (it is killed) when it did not."""
        try:
            reply = self.receive(time.monotonic() + timeout_s)
        except (OSError, ValueError):
            reply = None
        if not reply or not reply.get("ready"):
            status = self.kill()
            raise OSError(f"the chat-template worker did not start (exit status {status})")

    def receive(self, deadline: float) -> dict[str, Any] | None:
        """The reply, or None when the deadline passed or the worker closed its output."""
        import json

        head = self._read(HEADER.size, deadline)
        if head is None:
            return None
        (size,) = HEADER.unpack(head)
        body = self._read(size, deadline)
        return None if body is None else json.loads(body.decode("ascii"))

    def _read(self, size: int, deadline: float) -> bytes | None:
        chunks: list[bytes] = []
        left = size
        while left:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not select.select([self.fd], [], [], timeout)[0]:
                return None
            chunk = os.read(self.fd, min(left, 1 << 20))
            if not chunk:
                return None  # the worker exited
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> int | None:
        """Stop the worker; its exit status (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        return self.proc.wait()


class TemplatePool:
    """Renders chat templates in worker processes (see the module doc). Thread-safe."""

    def __init__(self, budget: TemplateBudget | None = None, min_workers: int = 2,
                 max_workers: int = 8) -> None:
        self.budget = budget or TemplateBudget.from_env()
        self.max_workers = max_workers
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._num_workers = 0  # idle + busy
        self._closed = False
        # Start the first workers now, off the caller's thread: the first chat is fast too.
        threading.Thread(target=self._prestart, args=(min_workers,), daemon=True,
                         name="cadence-template-prestart").start()

    def _prestart(self, n: int) -> None:
        for _ in range(n):
            with self._lock:
                if self._closed or self._num_workers >= n:
                    return
                self._num_workers += 1
            try:
                worker = self._start_worker()
            except OSError:
                with self._lock:
                    self._num_workers -= 1
                return
            self._release(worker, healthy=True)

    def _start_worker(self) -> _Worker:
        worker = _Worker(self.budget)
        worker.wait_ready()
        return worker

    def _acquire(self, deadline: float) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise TemplateWorkerError("the template pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._num_workers < self.max_workers:
                    self._num_workers += 1
                    break
                if not self._lock.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise TemplateWorkerError(
                        f"every chat-template worker stayed busy for "
                        f"{self.budget.wall_seconds:g}s; retry later")
        try:
            return self._start_worker()
        except OSError as exc:
            with self._lock:
                self._num_workers -= 1
                self._lock.notify()
            raise TemplateWorkerError(f"could not start a chat-template worker: {exc}") from exc

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(worker)
            else:
                self._num_workers -= 1
                worker.kill()
            self._lock.notify()

    def render(self, source: str, bos_token: str | None, eos_token: str | None,
               messages: list[dict[str, Any]], add_generation_prompt: bool,
               **kwargs: Any) -> str:
        """The rendered prompt; ValueError for a template error, TemplateBudgetError for a
        broken budget (both the client's fault)."""
        budget = self.budget
        # Waiting for a busy pool is bounded by the wall budget too (then a 503); the render's
        # own deadline starts once it has a ready worker.
        deadline = time.monotonic() + budget.wall_seconds
        request = {"source": source, "bos": bos_token, "eos": eos_token, "messages": messages,
                   "add_generation_prompt": add_generation_prompt, "kwargs": kwargs}
        for attempt in range(2):
            worker = self._acquire(deadline)
            try:
                worker.send(request)
                deadline = time.monotonic() + budget.wall_seconds
                break
            except OSError as exc:  # an idle worker that died: a fresh one takes the request
                self._release(worker, healthy=False)
                if attempt:
                    raise TemplateWorkerError(f"the chat-template worker failed: {exc}") from exc
        try:
            reply = worker.receive(deadline)
        except (OSError, ValueError):  # a broken reply: treated as a worker that died
            reply = None
        if reply is None:
            timed_out = worker.proc.poll() is None
            self._release(worker, healthy=False)  # killed (if still running) and replaced
            status = worker.proc.returncode
            if timed_out:
                raise TemplateBudgetError(
                    f"the chat template ran past its time budget ({budget.wall_seconds:g}s)")
            if status == -signal.SIGXCPU:
                raise TemplateBudgetError(
                    f"the chat template ran past its CPU-time budget ({budget.cpu_seconds:g}s)")
            if status == -signal.SIGKILL:  # the kernel's OOM killer
                raise TemplateBudgetError(self._memory_message())
            # Any other death happened while rendering this template (an allocation that
            # failed where Python could not raise MemoryError aborts the interpreter).
            raise TemplateBudgetError(
                f"the chat template crashed its renderer (exit status {status}), likely past "
                f"its memory budget ({self.budget.memory_bytes / 2**20:.0f} MiB)")
        if reply.get("budget") == "memory":
            self._release(worker, healthy=False)
            raise TemplateBudgetError(self._memory_message())
        self._release(worker, healthy=True)
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["text"]

    def _memory_message(self) -> str:
        return (f"the chat template ran past its memory budget "
                f"({self.budget.memory_bytes / 2**20:.0f} MiB)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._lock.notify_all()
        for worker in idle:
            worker.kill()
