"""Host-side measurement and killing of one sandbox through the kernel, not through the sandbox.

For a container of a *local* engine (its init's pid is visible in this pid namespace and
its cgroup names the container) the host reads CPU time, peak memory and OOM kills from
the container's cgroup files (v1 or v2) and kills it through a pidfd of its init: SIGKILL
to a pid namespace's init kills every process in it, and a pidfd can never hit a recycled
pid. Both cost microseconds, against tens of milliseconds for the engine's API. A remote
engine (dind) has no such view: `CgroupMeter.open` returns None and the caller uses the
engine's stats and kill instead.

The process backend gets a cgroup of its own per execution (`ProcessCgroup`, as root or in a
delegated v2 subtree): every process the sandbox ever starts is in it, however it forks, reparents or
ptraces, so its CPU time is exact, and `memory.max`/`pids.max` (v1: `memory.limit_in_bytes`,
`pids.max`) cap all of them together; the backend refuses to run where it cannot set them.
"""

from __future__ import annotations

import os
import select
import signal
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Usage:
    """CPU seconds, peak memory bytes (None where the cgroup has no such file), OOM kills so far."""

    cpu_seconds: float
    memory_peak_bytes: int | None
    oom_kills: int


@lru_cache(maxsize=1)
def _mounts() -> dict[str, Path]:
    """Controller (or "unified") -> mount point, from this process's mountinfo."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2":
            found.setdefault("unified", Path(fields[4]))
        elif rest[0] == "cgroup":
            for option in rest[2].split(","):
                found.setdefault(option, Path(fields[4]))
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


class CgroupFiles:
    """The accounting files of one cgroup (v1: cpuacct + memory controllers; v2: one directory)."""

    def __init__(self, cpu: Path, memory: Path, procs: Path, v2: bool, *, keep_open: bool = False) -> None:
        self._cpu, self._memory, self._procs, self._v2 = cpu, memory, procs, v2
        self._peak_fd: int | None = None  # v2: the memory.peak file a reset applies to
        # keep_open: the accounting files are read through descriptors kept open (a warm container's are read
        # twice an execution, on its call's path: an open and a close fewer each time)
        self._fds: dict[str, int] | None = {} if keep_open else None

    def _file(self, where: Path, name: str) -> str | None:
        if self._fds is None:
            return _read(where / name)
        try:
            fd = self._fds.get(name)
            if fd is None:
                fd = self._fds[name] = os.open(where / name, os.O_RDONLY)
            return os.pread(fd, 4096, 0).decode("ascii")
        except OSError:
            return None

    def _close_files(self) -> None:
        self._close_peak()
        for fd in (self._fds or {}).values():
            os.close(fd)
        self._fds = None  # read as a one-off from now on, if at all

    def reset_peak(self) -> None:
        """Count peak memory afresh from now (one container serves many executions): v1 resets the
        cgroup's figure; v2 (kernel 6.12+) resets it for reads through one open file. Where neither
        works, the figure stays the container's peak so far, an upper bound."""
        if not self._v2:
            try:
                (self._memory / "memory.max_usage_in_bytes").write_text("0", encoding="ascii")
            except OSError:
                pass
            return
        self._close_peak()
        try:
            fd = os.open(self._memory / "memory.peak", os.O_RDWR)
        except OSError:
            return
        try:
            os.write(fd, b"reset\n")
        except OSError:
            os.close(fd)
            return
        self._peak_fd = fd

    def _close_peak(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None

    def _v2_peak(self) -> str | None:
        if self._peak_fd is not None:
            try:
                return os.pread(self._peak_fd, 64, 0).decode("ascii")
            except OSError:
                return None
        return self._file(self._memory, "memory.peak")

    def usage(self) -> Usage | None:
        """The cgroup's totals so far; None once it is gone."""
        if self._v2:
            usec = _keyed(self._file(self._cpu, "cpu.stat"), "usage_usec")
            if usec is None:
                return None
            peak = self._v2_peak()
            return Usage(usec / 1e6, int(peak) if peak and peak.strip().isdigit() else None,
                         _keyed(self._file(self._memory, "memory.events"), "oom_kill") or 0)
        nanos = self._file(self._cpu, "cpuacct.usage")
        if nanos is None or not nanos.strip().isdigit():
            return None
        peak = self._file(self._memory, "memory.max_usage_in_bytes")
        return Usage(int(nanos) / 1e9, int(peak) if peak and peak.strip().isdigit() else None,
                     _keyed(self._file(self._memory, "memory.oom_control"), "oom_kill") or 0)

    def empty(self) -> bool:
        procs = _read(self._procs)
        return procs is None or not procs.strip()


class ProcessCgroup(CgroupFiles):
    """A fresh cgroup for one process-backend execution, below this worker's own cgroups: v1 one directory
    per controller (cpuacct, memory, pids), v2 one directory. `limit` caps its memory and processes."""

    def __init__(self, dirs: list[Path], v2: bool) -> None:
        memory = dirs[1] if len(dirs) > 1 else dirs[0]
        super().__init__(dirs[0], memory, dirs[0] / "cgroup.procs", v2)
        self.dirs = dirs
        self._pids_dir = dirs[0] if v2 else (dirs[2] if len(dirs) > 2 else None)

    @classmethod
    def create(cls) -> ProcessCgroup | None:
        """None where this worker cannot make one (not root, no cgroup mounts, no delegated subtree)."""
        own = _read(Path("/proc/self/cgroup")) or ""
        paths = {}
        for line in own.splitlines():
            _, controllers, where = line.split(":", 2)
            for controller in (controllers.split(",") if controllers else ["unified"]):
                paths[controller] = where.lstrip("/")
        mounts, name = _mounts(), f"reactq-sandbox-{uuid.uuid4().hex[:12]}"
        if "cpuacct" in mounts and "memory" in mounts:
            kinds = ("cpuacct", "memory", "pids") if "pids" in mounts else ("cpuacct", "memory")
            wanted = [mounts[c] / paths.get(c, "") / name for c in kinds]
            v2 = False
        elif "unified" in mounts:
            return cls._create_v2(mounts["unified"], paths.get("unified", ""), name)
        else:
            return None
        made: list[Path] = []
        try:
            for path in wanted:
                path.mkdir()
                made.append(path)
        except OSError:
            for path in made:
                _rmdir(path)
            return None
        return cls(made, v2)

    @classmethod
    def _create_v2(cls, mount: Path, own: str, name: str) -> ProcessCgroup | None:
        """v2: below this worker's own cgroup where its children get the memory and pids controllers (a
        delegated subtree set up so); else, as root, below a `reactq-sandboxes` cgroup of the hierarchy's
        root (no process lives there, so the controllers can be enabled for its children: the kernel's
        no-internal-processes rule refuses that in a cgroup holding this worker); else an accounting-only
        child of its own (`limit` then says what is missing)."""
        candidates = [mount / own, mount / "reactq-sandboxes"]
        for parent in candidates:
            try:
                parent.mkdir(exist_ok=True)
            except OSError:
                continue
            _enable_controllers(parent, ("memory", "pids"))
            child = parent / name
            try:
                child.mkdir()
            except OSError:
                continue
            if (child / "memory.max").exists() and (child / "pids.max").exists():
                return cls([child], True)
            _rmdir(child)
        try:
            (mount / own / name).mkdir()
        except OSError:
            return None
        return cls([mount / own / name], True)

    def limit(self, memory_bytes: int, pids: int) -> str:
        """Cap every process of the cgroup together at `memory_bytes` (no swap beyond it where swap is
        accounted) and `pids` processes; why not ('' when both limits hold, read back from the kernel)."""
        if self._v2:
            required = [(self._memory / "memory.max", memory_bytes)]
            optional = [(self._memory / "memory.swap.max", 0), (self._memory / "memory.oom.group", 1)]
        else:
            # memsw (memory + swap) must be set after the plain limit, which it may not undercut.
            required = [(self._memory / "memory.limit_in_bytes", memory_bytes)]
            optional = [(self._memory / "memory.memsw.limit_in_bytes", memory_bytes)]
        if self._pids_dir is None:
            return "the pids cgroup controller is not mounted"
        required.append((self._pids_dir / "pids.max", pids))
        for path, value in required:
            if not path.exists():
                return f"{path.name} is missing (the {path.name.split('.')[0]} controller is not enabled here)"
            try:
                path.write_text(str(value), encoding="ascii")
            except OSError as exc:
                return f"cannot write {path.name} ({exc.strerror or exc.__class__.__name__})"
            if (_read(path) or "").strip() != str(value):
                return f"{path.name} did not take the value {value}"
        for path, value in optional:
            try:
                path.write_text(str(value), encoding="ascii")
            except OSError:
                pass  # no swap accounting (v1 memsw, v2 swap.max) or an older kernel (oom.group)
        return ""

    def delegate(self, uid: int) -> None:
        """Let `uid` (the sandbox's launcher) move itself in; nothing else of the cgroup becomes its."""
        for path in self.dirs:
            os.chown(path / "cgroup.procs", uid, -1)

    def join(self) -> None:
        """Move the calling process into the cgroup (from the sandbox's preexec_fn, before exec)."""
        for path in self.dirs:
            with open(path / "cgroup.procs", "w", encoding="ascii") as f:
                f.write("0")

    def kill_all(self, timeout: float = 2.0) -> bool:
        """SIGKILL every process left in the cgroup until it is empty; False if that took too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            procs = (_read(self._procs) or "").split()
            if not procs:
                return True
            for pid in procs:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            time.sleep(0.002)
        return False

    def remove(self) -> None:
        for path in reversed(self.dirs):
            _rmdir(path)


def _enable_controllers(parent: Path, controllers: tuple[str, ...]) -> None:
    """v2: make `controllers` available to the children of `parent` (a delegated subtree, or the root);
    where the kernel refuses (processes in `parent`, not delegated), the children lack their files."""
    enabled = (_read(parent / "cgroup.subtree_control") or "").split()
    wanted = " ".join(f"+{c}" for c in controllers if c not in enabled)
    if wanted:
        try:
            (parent / "cgroup.subtree_control").write_text(wanted, encoding="ascii")
        except OSError:
            pass


def limits_unavailable(memory_bytes: int = 64 << 20, pids: int = 16) -> str:
    """Why this worker cannot cap a sandbox's total memory and processes with a cgroup ('' when it can):
    one cgroup made, limited and removed."""
    cgroup = ProcessCgroup.create()
    if cgroup is None:
        return ("this worker cannot create a cgroup (it needs root, or a delegated cgroup v2 subtree, "
                "and the memory and pids controllers)")
    try:
        return cgroup.limit(memory_bytes, pids)
    finally:
        cgroup.remove()


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last killed process is still leaving the cgroup


class CgroupMeter(CgroupFiles):
    """Reads one container's cgroup and kills it through its init's pidfd."""

    def __init__(self, pidfd: int, cpu: Path, memory: Path, procs: Path, v2: bool) -> None:
        super().__init__(cpu, memory, procs, v2, keep_open=True)
        self.pidfd = pidfd

    @classmethod
    def open(cls, pid: int, container_id: str) -> CgroupMeter | None:
        """A meter for the container whose init is host pid `pid`; None where the host cannot see it."""
        if pid <= 0:
            return None
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        meter = cls._resolve(pid, container_id, pidfd)
        if meter is None:
            os.close(pidfd)
        return meter

    @classmethod
    def _resolve(cls, pid: int, container_id: str, pidfd: int) -> CgroupMeter | None:
        text = _read(Path(f"/proc/{pid}/cgroup"))
        if text is None or container_id not in text:
            return None  # not this container's process (remote engine, or the pid was reused)
        mounts = _mounts()
        paths: dict[str, str] = {}
        for line in text.splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in (controllers.split(",") if controllers else ["unified"]):
                paths[controller] = path.lstrip("/")
        if "cpuacct" in paths and "memory" in paths and "pids" in paths:
            cpu = mounts.get("cpuacct")
            memory = mounts.get("memory")
            pids = mounts.get("pids")
            if cpu and memory and pids:
                return cls(pidfd, cpu / paths["cpuacct"], memory / paths["memory"],
                           pids / paths["pids"] / "cgroup.procs", v2=False)
        unified = mounts.get("unified")
        if unified and "unified" in paths and container_id in paths["unified"]:
            base = unified / paths["unified"]
            return cls(pidfd, base, base, base / "cgroup.procs", v2=True)
        return None

    def kill(self, timeout: float = 2.0) -> bool:
        """SIGKILL the container's init (so the kernel kills its whole pid namespace) and wait until
        no process is left in its cgroup; False if that did not happen within `timeout`."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except OSError:
            return False
        # The pidfd turns readable when the init has exited, which the kernel lets happen only once
        # every other process of its pid namespace is gone: one wake-up, no polling.
        waiter = select.poll()
        waiter.register(self.pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        waiter.poll(timeout * 1000)
        while not self.empty():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        self._close_files()
        try:
            os.close(self.pidfd)
        except OSError:
            pass
