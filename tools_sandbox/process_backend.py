"""The no-Docker fallback: the agent in fresh namespaces via bubblewrap, with rlimits.

WEAKER ISOLATION than the Docker backend, and every result it produces says so
(`backend="process"`). What it gives: new user/pid/net/ipc/uts/cgroup namespaces
(no network at all), uid 65534, no capabilities, a read-only view of /usr only (no
/etc, /home, /root, /work, no host env), a size-capped private /tmp, and rlimits for
CPU time, address space, file size, open files and processes. What it lacks: cgroup
memory/CPU/pids limits (RLIMIT_NPROC counts every process of uid 65534 on the host,
RLIMIT_AS is not a cgroup limit), seccomp filtering beyond bwrap's defaults, and a
separate kernel view of /usr (host-installed python packages are visible read-only).
Used only when chosen, or when no Docker engine answers.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import time

from .errors import SandboxUnavailable
from .models import SandboxResult, Tier
from .protocol import FrameParser, agent_source, decode, encode_request, interpret_exit

_ERR_CAP = 4096
NOBODY = 65534


class ProcessBackend:
    """Runs each execution as a bwrap-confined subprocess of this worker."""

    name = "process"

    def __init__(self, python: str = "/usr/bin/python3") -> None:
        self.python = python
        self._bwrap: str | None = None

    def start(self) -> None:
        self._bwrap = shutil.which("bwrap")
        if self._bwrap is None:
            raise SandboxUnavailable("the process backend needs bubblewrap (apt-get install bubblewrap)")
        if not os.path.exists(self.python):
            raise SandboxUnavailable(f"the process backend's interpreter {self.python} is missing")

    def close(self) -> None:
        self._bwrap = None

    def command(self, tier: Tier) -> list[str]:
        if self._bwrap is None:
            raise SandboxUnavailable("the process backend is not started")
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
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--setenv", "OPENBLAS_NUM_THREADS", "1",
            self.python, "-I", "-c", agent_source(),
        ]
        return cmd

    def execute(self, code: str, tier: Tier) -> SandboxResult:
        started = time.monotonic()
        deadline = started + tier.wall_time_s
        as_root = os.geteuid() == 0
        fsize = tier.tmpfs_mb * 1024 * 1024

        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_NOFILE, (tier.nofile, tier.nofile))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        try:
            proc = subprocess.Popen(
                self.command(tier), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, close_fds=True, start_new_session=True, preexec_fn=limits,
                user=NOBODY if as_root else None, group=NOBODY if as_root else None,
                extra_groups=[] if as_root else None, cwd="/",
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start bwrap: {exc}") from exc
        parser = FrameParser(cap=tier.output_bytes)
        agent_err = bytearray()
        timed_out = False
        assert proc.stdin and proc.stdout and proc.stderr
        try:
            proc.stdin.write(encode_request(code, tier, as_bytes=tier.memory_mb * 1024 * 1024,
                                            nproc=tier.pids))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        open_streams = 2
        while open_streams and parser.exit is None and parser.protocol_error is None and not parser.truncated:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                elif key.data == "out":
                    parser.feed(data)
                elif len(agent_err) < _ERR_CAP:
                    agent_err += data[: _ERR_CAP - len(agent_err)]
        sel.close()
        self._kill(proc)
        exit_code: int | None = None
        oom = False
        error = None
        note = ""
        if parser.exit is not None and not timed_out:
            info = interpret_exit(parser.exit, tier)
            exit_code, note = info.exit_code, info.stderr_note
            timed_out = info.cpu_limited
            oom = info.memory_error
            parser.truncated = parser.truncated or bool(parser.exit.get("truncated"))
        elif not timed_out and not parser.truncated:
            why = parser.protocol_error or "the sandbox exited without a result"
            error = f"sandbox_failed: {why}; bwrap said: {decode(agent_err)[-500:]!r}"
        return SandboxResult(
            exit_code=exit_code, stdout=decode(parser.stdout), stderr=decode(parser.stderr) + note,
            timed_out=timed_out, oom_killed=oom, truncated=parser.truncated,
            duration_ms=int((time.monotonic() - started) * 1000), tier=tier.name, error=error,
            backend=self.name,
        ).with_cpu(parser.exit.get("cpu_s") if parser.exit else None)

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        """Kill the whole session (bwrap and, via --die-with-parent, everything it started)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
