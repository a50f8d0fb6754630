"""The chat-template worker process: renders templates under limits the OS enforces.

    python -m cadence.engine.template_worker CPU_SECONDS MEMORY_BYTES

Run by template_pool.TemplatePool, one of a small persistent pool. It reads framed JSON
requests on stdin and writes framed JSON replies on stdout (8-byte big-endian length, then
ASCII JSON: no pickles cross, and lone surrogates survive as escapes):

    request  {"source", "bos", "eos", "messages", "add_generation_prompt", "kwargs"}
    reply    {"text": ...} | {"error": ..., "budget": null | "memory"}

Once started (imports done, limits set) it writes {"ready": true}: the pool starts a render's
wall-clock deadline only then, so a slow start on a loaded host is not charged to the template.

The limits are the process's, so they hold whatever the template does (jinja's sandbox stops
attribute tricks; it cannot stop `~` concatenation or big-integer arithmetic):
- RLIMIT_AS: the address space may grow MEMORY_BYTES past what the idle worker uses; past it
  allocations fail (MemoryError, replied as the memory budget, then the worker exits so a
  fresh one replaces it).
- RLIMIT_CPU: before each render the soft limit is set CPU_SECONDS past the CPU time used so
  far; past it the kernel sends SIGXCPU, which kills the worker (the pool reports the CPU
  budget and starts another).
- The pool kills a worker that has not replied by its wall-clock deadline.
The worker runs at a lower priority (nice 10): a template bomb takes CPU from no engine step.
Only stdlib and jinja2 are imported here (no torch): a worker starts in a fraction of a second.
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct(">Q")
# Compiled templates kept per worker (requests may carry their own chat_template).
MAX_CACHED_TEMPLATES = 8


def write_frame(stream: BinaryIO, obj: dict[str, Any]) -> None:
    data = json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next request, or None at end of input (the pool closed the pipe)."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    return json.loads(stream.read(size).decode("ascii"))


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:  # sizes in pages; the first is the whole VM
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _limit_cpu(seconds: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used + seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main(cpu_seconds: float, memory_bytes: int) -> None:
    from cadence.model.chat_template import ChatTemplate  # jinja2 is loaded before the limit

    try:
        os.nice(10)
    except OSError:
        pass
    limit = _address_space_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, {"ready": True})
    templates: dict[tuple[str, str, str], ChatTemplate] = {}
    while True:
        request = read_frame(stdin)
        if request is None:
            return
        _limit_cpu(cpu_seconds)
        try:
            key = (request["source"], request["bos"] or "", request["eos"] or "")
            template = templates.get(key)
            if template is None:
                if len(templates) >= MAX_CACHED_TEMPLATES:
                    templates.pop(next(iter(templates)))
                template = templates[key] = ChatTemplate(*key)
            text = template.render(request["messages"], request["add_generation_prompt"],
                                   **request["kwargs"])
            reply: dict[str, Any] = {"text": text}
        except MemoryError:
            reply = {"error": "out of memory", "budget": "memory"}
        except (ValueError, TypeError, KeyError) as exc:
            reply = {"error": str(exc), "budget": None}
        except RecursionError:
            reply = {"error": "the template recursed too deeply", "budget": None}
        try:
            write_frame(stdout, reply)
        except MemoryError:
            write_frame(stdout, {"error": "out of memory", "budget": "memory"})
            return
        if reply.get("budget") == "memory":
            return  # the heap may be fragmented near the limit: a fresh worker replaces us


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]))
