"""Reading Linux /proc/PID/stat: CPU time, parent, state of a process (benchmarks, tests)."""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None if gone.

    The name is in parentheses and may contain spaces, so split after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, 0 when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    """The processes (zombies included) whose parent is `pid`."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"
