"""Who started a sandbox container: a label naming its worker process, and whether that process lives.

The label is host/pid/start-time, so a recycled pid is never mistaken for the worker that made
the container (the pool's start-up reaping and the sweeper's `orphan` rule read it).
"""

from __future__ import annotations

import os
import socket


def owner_id(pid: int | None = None) -> str:
    """host/pid/start-time: identifies a live process even across pid reuse."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}/{pid}/{_proc_start_time(pid)}"


def _proc_start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def owner_alive(owner: str) -> bool:
    """Whether the process that labelled a container is still running on this host."""
    host, _, rest = owner.partition("/")
    pid_s, _, start = rest.partition("/")
    if host != socket.gethostname() or not pid_s.isdigit():
        return True  # not ours to judge: another host's worker owns it
    return os.path.exists(f"/proc/{pid_s}") and _proc_start_time(int(pid_s)) == start
