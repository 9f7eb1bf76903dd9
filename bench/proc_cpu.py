"""CPU seconds of every process on the machine, from /proc, grouped by what the process is for reactq.

A snapshot holds each live process's own CPU (user + system) and the CPU of the children it has reaped
(cutime + cstime): a process that starts and ends between two snapshots (a `runc` call, an execution inside a
container) is counted in its parent's reaped CPU, one that starts after the first snapshot is counted whole.
`machine_busy_s` (from /proc/stat) is the check: what no group explains is reported as `other`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    name: str  # comm
    own_s: float  # utime + stime
    reaped_s: float  # cutime + cstime: children it waited for
    started: int  # starttime, in clock ticks since boot (tells a reused pid apart)


def snapshot() -> dict[int, Proc]:
    procs = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        f = rest.split()
        pid = int(stat.parent.name)
        procs[pid] = Proc(pid, int(f[1]), name, (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK,
                          int(f[19]))
    return procs


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one live process, threads included (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def descendants(procs: dict[int, Proc], roots: set[int]) -> set[int]:
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for p in procs.values():
            if p.ppid in found and p.pid not in found:
                found.add(p.pid)
                grew = True
    return found


def cpu_by_group(before: dict[int, Proc], after: dict[int, Proc], group_of: Callable[[Proc], str | None]
                 ) -> dict[str, float]:
    """CPU seconds each group spent between the snapshots: own CPU, plus reaped children's under the parent's
    group. `group_of(proc)` names a process of `after` by its group (None: not ours to name; it lands in
    `other`)."""
    spent: dict[str, float] = {}
    for pid, now in after.items():
        group = group_of(now)
        if group is None:
            continue
        then = before.get(pid)
        if then is not None and then.started != now.started:
            then = None  # the pid was reused
        own = now.own_s - (then.own_s if then else 0.0)
        reaped = now.reaped_s - (then.reaped_s if then else 0.0)
        spent[group] = spent.get(group, 0.0) + own + reaped
    return spent
