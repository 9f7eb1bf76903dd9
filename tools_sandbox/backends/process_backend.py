"""The no-Docker fallback: the agent in fresh namespaces, with rlimits.

WEAKER ISOLATION than the Docker backend, and every result it produces says so:
`backend="process"` when bubblewrap confines it, `backend="process-unshare"` when
util-linux `unshare` does (bwrap is a Debian package, not pip-installable, so a fresh
machine often lacks it; unshare is always there but needs root).

What both give: new pid/net/ipc/uts/cgroup/mount namespaces (no network at all), uid
and gid 65534 with no capabilities and no_new_privs, a read-only view of /usr only (no
/etc, /home, /root, /work, no host env), a size-capped private /tmp, a read-only root,
and rlimits for CPU time, address space, file size, open files and processes; the
whole sandbox is killed with its worker and at the end of every call.
Differences: bwrap also runs in a new user namespace and brings loopback up; the
unshare path stays in the host user namespace (as uid 65534, without capabilities) and
leaves loopback down, and its mount setup runs as root (a shell script of fixed
commands, before any untrusted code) in the new namespaces.
Both run each execution in a cgroup of its own whose memory.max (no swap) and pids.max are the
tier's: every process the sandbox forks counts against one memory limit and one process limit
(RLIMIT_AS alone is per process, and RLIMIT_NPROC counts every process of uid 65534 on the host,
so neither is used to bound the sandbox as a whole). Where this worker cannot set those limits
(not root, no memory or pids controller, no delegated cgroup v2 subtree) the backend does not
start, naming why: no tier's memory limit could be enforced.
What both lack: a CPU-share limit (the CPU time rlimit and the wall-clock deadline bound a call),
seccomp filtering, and a separate view of /usr (host-installed python packages are visible read-only).
CPU time is the host's figure: wait4 on bwrap/unshare once the namespace's init has been
killed and reaped sums every process the sandbox ran (see `_stop`), never the agent's report.
Used only when chosen (`process`, or `auto` with no Docker engine); REACTQ_SANDBOX_PROCESS_CONFINEMENT
(auto | bwrap | unshare) picks the confinement, auto = bwrap when installed, else unshare.
"""

from __future__ import annotations

import ctypes
import os
import resource
import selectors
import shlex
import shutil
import signal
import subprocess
import time

from ..base.errors import SandboxUnavailable, TierUnavailable
from ..base.models import ReapReason, SandboxResult, Tier
from ..base.protocol import FrameParser, agent_source, decode, encode_request
from ..base.sweeper import SweepPolicy
from .cgroup import ProcessCgroup, Usage, limits_unavailable
from .outcome import HostFacts, finish

_ERR_CAP = 4096
NOBODY = 65534
CONFINEMENTS = ("auto", "bwrap", "unshare")
# Where the unshare path looks for its tools: a worker's PATH may lack the sbin dirs.
_TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_UNSHARE_TOOLS = ("unshare", "setpriv", "mount", "umount", "pivot_root")
_PR_SET_PDEATHSIG = 1
_SANDBOX_ENV = (("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", "/tmp"), ("LANG", "C.UTF-8"),
                ("PYTHONDONTWRITEBYTECODE", "1"), ("OPENBLAS_NUM_THREADS", "1"))


def unshare_unavailable(euid: int) -> str:
    """Why the unshare confinement cannot work for this user on this host ('' when it can)."""
    if euid != 0:
        return "the util-linux unshare fallback needs root (run the sandbox worker as root)"
    missing = [tool for tool in _UNSHARE_TOOLS if shutil.which(tool, path=_TOOL_PATH) is None]
    if missing:
        return f"the util-linux unshare fallback lacks {', '.join(missing)} (apt-get install util-linux mount)"
    return ""


class ProcessBackend:
    """Runs each execution as a namespaced subprocess of this worker (bwrap, else unshare)."""

    name = "process"

    def __init__(self, python: str = "/usr/bin/python3", confinement: str = "auto") -> None:
        self.python = python
        self.confinement = confinement  # REACTQ_SANDBOX_PROCESS_CONFINEMENT, passed by the service
        self._bwrap: str | None = None
        self._unshare: str | None = None
        self._libc: ctypes.CDLL | None = None

    def start(self) -> None:
        choice = self.confinement
        if choice not in CONFINEMENTS:
            raise ValueError(f"unknown process confinement {choice!r}; use {', '.join(CONFINEMENTS)}")
        if not os.path.exists(self.python):
            raise SandboxUnavailable(f"the process backend's interpreter {self.python} is missing")
        if why := limits_unavailable():
            raise SandboxUnavailable(f"the process backend cannot enforce any tier's memory and process limits: "
                                     f"{why}; run the sandbox worker as root on a host with the memory and pids "
                                     "cgroup controllers, or use the Docker backend")
        bwrap = shutil.which("bwrap") if choice != "unshare" else None
        if bwrap is not None:
            self._bwrap, self.name = bwrap, "process"
            return
        if choice == "bwrap":
            raise SandboxUnavailable("the process backend needs bubblewrap (apt-get install bubblewrap)")
        prefix = "" if choice == "unshare" else "bubblewrap is not installed (apt-get install bubblewrap) and "
        why = unshare_unavailable(os.geteuid())
        if why:
            raise SandboxUnavailable(f"the process backend cannot confine code: {prefix}{why}")
        self._unshare = shutil.which("unshare", path=_TOOL_PATH)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.name = "process-unshare"
        try:
            self._probe_unshare()
        except SandboxUnavailable as exc:
            self.close()
            raise SandboxUnavailable(f"the process backend cannot confine code: {prefix}{exc}") from None

    def close(self) -> None:
        self._bwrap = None
        self._unshare = None

    def ping(self) -> None:
        """The process backend needs no service: it can run code while it is started."""
        if self._bwrap is None and self._unshare is None:
            raise SandboxUnavailable("the process backend is not started")

    def sweep(self, policy: SweepPolicy) -> list[tuple[str, ReapReason]]:
        """Nothing outlives a call here: each sandbox is killed at its end and dies with this worker."""
        return []

    def _probe_unshare(self) -> None:
        """Build one empty sandbox now, so a host that forbids it fails at start, not per call."""
        probe = Tier.model_validate({
            "name": "probe", "cpus": 1, "memory_mb": 64, "wall_time_s": 10, "cpu_time_s": 1, "pids": 8,
            "output_bytes": 1024, "tmpfs_mb": 1,
            "quota": {"concurrent_executions": 1, "executions_per_minute": 1, "cpu_seconds_per_day": 1},
        })
        try:
            done = subprocess.run(self._unshare_command(probe, ["true"]), env={}, capture_output=True,
                                  timeout=10, check=False, preexec_fn=self._die_with_parent)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"cannot start unshare: {exc}") from exc
        if done.returncode != 0:
            said = decode(done.stderr).strip()[-300:]
            raise SandboxUnavailable(f"util-linux unshare cannot build a sandbox here (needs CAP_SYS_ADMIN): {said!r}")

    def command(self, tier: Tier) -> list[str]:
        agent = [self.python, "-I", "-c", agent_source()]
        if self._bwrap is not None:
            return self._bwrap_command(tier, agent)
        if self._unshare is not None:
            return self._unshare_command(tier, agent)
        raise SandboxUnavailable("the process backend is not started")

    def _bwrap_command(self, tier: Tier, agent: list[str]) -> list[str]:
        assert self._bwrap is not None
        cmd = [
            self._bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr",
        ]
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}"):
                cmd += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                cmd += ["--ro-bind", f"/{link}", f"/{link}"]
        cmd += [
            "--size", str(tier.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp",
            "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp", "--hostname", "sandbox",
            # bwrap's own root is a writable tmpfs: make it read-only after the mounts.
            "--remount-ro", "/",
            "--uid", str(NOBODY), "--gid", str(NOBODY), "--clearenv",
        ]
        for key, value in _SANDBOX_ENV:
            cmd += ["--setenv", key, value]
        return cmd + agent

    def _unshare_command(self, tier: Tier, agent: list[str]) -> list[str]:
        """unshare (as root) + a fixed setup script that builds bwrap's view, then setpriv to 65534.

        The script takes no untrusted input: the agent command arrives as "$@". --kill-child
        and setpriv --pdeathsig kill the namespace's init (the agent) when unshare dies.
        """
        assert self._unshare is not None
        binds = []
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}"):
                binds.append(f"ln -s {shlex.quote(os.readlink(f'/{link}'))} {link}")
            elif os.path.isdir(f"/{link}"):
                binds.append(f"mkdir {link} && mount --bind /{link} {link} "
                             f"&& mount -o remount,bind,ro,nosuid,nodev {link}")
        devices = "null zero full random urandom tty"
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in _SANDBOX_ENV)
        script = "\n".join([
            "set -eu",
            f"PATH={_TOOL_PATH}",
            # A tmpfs over /tmp becomes the new root (in this mount namespace only).
            "mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev sandbox-root /tmp",
            "cd /tmp",
            "mkdir usr tmp proc dev .old",
            "mount --bind /usr usr && mount -o remount,bind,ro,nosuid,nodev usr",
            *binds,
            f"mount -t tmpfs -o size={tier.tmpfs_mb * 1024 * 1024},mode=1777,nosuid,nodev sandbox-tmp tmp",
            "mount -t proc -o nosuid,nodev,noexec proc proc",
            "mount -t tmpfs -o size=64k,mode=0755,nosuid,noexec sandbox-dev dev",
            f"for d in {devices}; do : > dev/$d && mount --bind /dev/$d dev/$d; done",
            "ln -s /proc/self/fd dev/fd && ln -s /proc/self/fd/0 dev/stdin",
            "ln -s /proc/self/fd/1 dev/stdout && ln -s /proc/self/fd/2 dev/stderr",
            "mount -o remount,ro,nosuid,noexec dev",
            "echo sandbox > proc/sys/kernel/hostname",
            # Drop the host's mounts entirely: nothing of it stays reachable, not even by path.
            "pivot_root . .old && umount -l /.old && rmdir /.old",
            "mount -o remount,ro,nosuid,nodev /",
            "cd /tmp",
            f"exec env -i {env} setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups "
            "--inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs --pdeathsig KILL \"$@\"",
        ])
        return [
            self._unshare, "--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts", "--cgroup",
            "--propagation", "private", "/bin/sh", "-c", script, "sandbox", *agent,
        ]

    def _die_with_parent(self) -> None:
        """In the child before exec: the kernel kills unshare if this worker dies (bwrap's --die-with-parent)."""
        if self._libc is not None:
            self._libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def execute(self, code: str, tier: Tier, tenant: str = "") -> SandboxResult:
        if tier.runtime is not None:
            raise TierUnavailable(tier.name, f"it requires the OCI runtime {tier.runtime!r}, which the process "
                                  "backend cannot provide; the tier is refused rather than run with weaker isolation")
        started = time.monotonic()
        deadline = started + tier.wall_time_s
        # bwrap runs unprivileged (it sets up a user namespace); unshare needs root to mount.
        drop = os.geteuid() == 0 and self._unshare is None
        fsize = tier.tmpfs_mb * 1024 * 1024

        cgroup = ProcessCgroup.create()
        why = "no cgroup can be created for it" if cgroup is None else \
            cgroup.limit(tier.memory_mb * 1024 * 1024, tier.pids)
        if why:
            if cgroup is not None:
                cgroup.remove()
            raise TierUnavailable(tier.name, f"its memory limit of {tier.memory_mb} MB cannot be enforced by the "
                                  f"process backend here ({why})")
        assert cgroup is not None
        if drop:
            cgroup.delegate(NOBODY)

        def limits() -> None:
            cgroup.join()
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_NOFILE, (tier.nofile, tier.nofile))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            self._die_with_parent()

        try:
            proc = subprocess.Popen(
                self.command(tier), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, close_fds=True, start_new_session=True, preexec_fn=limits,
                user=NOBODY if drop else None, group=NOBODY if drop else None,
                extra_groups=[] if drop else None, cwd="/",
            )
        except (OSError, subprocess.SubprocessError) as exc:
            cgroup.remove()
            raise SandboxUnavailable(f"cannot start {self._tool()}: {exc}") from exc
        parser = FrameParser(cap=tier.output_bytes)
        agent_err = bytearray()
        timed_out = False
        usage: Usage | None = None
        try:
            assert proc.stdin and proc.stdout and proc.stderr
            try:
                # RLIMIT_AS turns one process's overdraft into a MemoryError; the cgroup caps them all
                # (and its pids.max the processes: no RLIMIT_NPROC, which would count other sandboxes').
                proc.stdin.write(encode_request(code, tier, as_bytes=tier.memory_mb * 1024 * 1024))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, "out")
                sel.register(proc.stderr, selectors.EVENT_READ, "err")
                open_streams = 2
                while open_streams and parser.exit is None and parser.protocol_error is None \
                        and not parser.truncated:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        timed_out = True
                        break
                    for key, _ in sel.select(remaining):
                        data = os.read(key.fd, 65536)
                        if not data:
                            sel.unregister(key.fileobj)
                            open_streams -= 1
                        elif key.data == "out":
                            parser.feed(data)
                        elif len(agent_err) < _ERR_CAP:
                            agent_err += data[: _ERR_CAP - len(agent_err)]
        finally:
            usage = self._stop(proc, cgroup)
        facts = HostFacts(started=started, timed_out=timed_out, agent_said=bytes(agent_err),
                          cpu_seconds=usage.cpu_seconds if usage is not None else None,
                          memory_peak_bytes=usage.memory_peak_bytes if usage is not None else None,
                          oom_killed=usage is not None and usage.oom_kills > 0)
        return finish(tier, self.name, parser, facts)

    def _tool(self) -> str:
        return "unshare" if self._unshare is not None else "bwrap"

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], cgroup: ProcessCgroup | None) -> Usage | None:
        """Kill the sandbox and return the CPU seconds of its whole process tree (None if unmeasurable).

        With a cgroup (a root worker), every process the sandbox started is in it, however it
        forked, reparented or ptraced: all are killed and the cgroup's totals read, exactly.
        Without one (best effort): the namespace's init is killed first (the kernel then kills
        every process in the pid namespace and the init reaps them), so bwrap or unshare, our
        direct child, reaps it and exits, and wait4 on it sums the CPU time of the processes
        reaped along that chain. A program that breaks the chain (a ptrace of its agent) can
        hide CPU time there: run the process backend as root, or use Docker.
        """
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        cpu: float | None = None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                cpu = rusage.ru_utime + rusage.ru_stime
                break
            time.sleep(0.002)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.returncode is None:
            proc.wait()
        usage = Usage(cpu, None, 0) if cpu is not None else None
        if cgroup is not None:
            cgroup.kill_all()
            usage = cgroup.usage() or usage
            cgroup.remove()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        return usage


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (the sandbox's namespace init)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found
