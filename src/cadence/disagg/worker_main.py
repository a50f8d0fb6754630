"""`python -m cadence.disagg.worker_main` with {"server": ServerConfig fields, "process":
EngineProcessConfig JSON} on stdin: one worker's HTTP server (the launcher and the Ray actors
start workers this way, with configs built from the parsed `cadence serve` flags)."""

from __future__ import annotations

import json
import sys


def _exit_with_parent() -> None:
    """A worker whose launcher died (even by SIGKILL) stops itself, engine process included."""
    import os
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="cadence-parent-watch", daemon=True).start()


def main() -> int:
    from cadence.engine.engine_process import EngineProcessConfig
    from cadence.server.config import ServerConfig
    from cadence.server.launcher import run_server

    _exit_with_parent()
    spec = json.loads(sys.stdin.read())
    server = ServerConfig(**spec["server"])
    process = EngineProcessConfig.from_json(json.dumps(spec["process"]))
    run_server(server, process, log_level=spec.get("log_level", "warning"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
