"""The in-sandbox supervisor: runs one program per request, each from a clean state, for one tenant.

This file is not imported by the host: its *source* is the container's (or bwrap's)
command (`python3 -c <source>`), so the image stays a plain Debian + python3 and
the supervisor always matches the host's version.

In a Docker sandbox the supervisor is the container's root with only SETUID, SETGID and
KILL. Before it reads its first request it forks a spawner (a zygote): a root process that
never reads a request or an output. Every execution process and every cleaner is forked
from the spawner ahead of its request, and the spawner reports their exits; the
supervisor hands the spawner only the pipes' ends (SCM_RIGHTS) and the tenant's uid. An
execution therefore holds nothing an earlier execution put in memory: not the last
request (its code, its tenant) nor the output the supervisor passed on. The child drops
to the tenant's execution uid (the host derives it from the tenant: tenants do not share
a uid, so per-user kernel limits are not shared across them; no capabilities left,
no_new_privs from the container) in a fresh empty working directory, reads its request
from its own pipe and runs the code there. The code cannot signal, ptrace or write to the
supervisor or the spawner: another uid, no capabilities, and none of their file
descriptors. After the program ends, a cleaner running as that uid kills every process of
the uid (kill(-1) reaches them all, whatever their group or session) and removes
everything the uid wrote in /tmp and /dev/mqueue, the only writable places; the
supervisor then checks that no process, file or SysV IPC object of the uid is left and
says whether it is clean. The host retires a container that is not. The first request
binds the supervisor to its tenant and uid; a request for another ends it (the host never
sends one: this is the second lock). Without root (the process backend) there is no uid to
drop to: the supervisor forks its one child before reading the request, serves that one
request and says it is not reusable.

Why an agent instead of `docker exec`: an exec costs a runc setup (~60-90 ms); the
supervisor is already running, and forking the warm interpreter costs ~1 ms.

Wire format (stdin -> supervisor): ASCII decimal length + newline + ASCII JSON request
    {"code", "cpu_time_s", "output_bytes", "tenant", "uid" (optional), "as_bytes" (optional), "nproc" (optional)}
(supervisor -> stdout): frames of 1 byte kind + 4-byte big-endian length + payload;
kind b"1" = program stdout, b"2" = program stderr, b"X" = JSON exit record, then
b"R" = JSON ready record {"clean": bool, "problem": str or null}. The request is pure
printable ASCII so it can never contain Docker's detach key sequence (ctrl-p ctrl-q)
on the attached stdin. Limits, timeouts and kills are enforced outside the sandbox.
"""

import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

EXEC_UID = 65534  # the default; a request's "uid" binds the supervisor to its tenant's own
UID_RANGE = (1000, 1 << 31)
WRITABLE = ("/tmp", "/dev/mqueue")
SETTLE_S = 1.0


def _read_frame(fd):
    """One length-prefixed request (bytes), or None at end of input."""
    digits = b""
    while not digits.endswith(b"\n"):
        c = os.read(fd, 1)
        if not c:
            return None
        if len(digits) > 12:
            os._exit(3)
        digits += c
    return _read_exact(fd, int(digits))


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            os._exit(3)
        buf += chunk
    return buf


def _send(kind, payload):
    data = kind + struct.pack(">I", len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _read_small(path):
    """A small kernel file's bytes, in one read: a text file object costs more than the read itself."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)


def _oom_kills():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            for line in _read_small(path).split(b"\n"):
                key, _, value = line.partition(b" ")
                if key == b"oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return -1


def _become_exec_uid(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _child(r_req, w_out, w_err, w_stat, privileged, serial, uid):
    """The execution process, from its fork on: ready ahead of its request, then the program. `uid` is
    the execution uid to become before the request arrives, or -1 when the spawner did not know it yet
    (a container's first execution): then the request's."""
    signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(w_out, 1)
    os.dup2(w_err, 2)
    os.dup2(w_stat, 3)
    os.dup2(r_req, 4)
    os.closerange(5, 4096)
    os.setsid()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if privileged and uid >= 0:
        _become_exec_uid(uid)  # before the request: dropping privileges costs milliseconds in a container
    _name(b"exec-waiting")
    raw = _read_frame(4)
    if raw is None:
        os._exit(0)
    os.close(4)
    req = json.loads(raw)
    if privileged and uid < 0:
        _become_exec_uid(_request_uid(req))
    _name(b"exec-program")
    code = req["code"]
    cpu = int(req["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if req.get("as_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (req["as_bytes"], req["as_bytes"]))
    if req.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (req["nproc"], req["nproc"]))
    if privileged:
        workdir = f"/tmp/run-{serial}"
        os.mkdir(workdir, 0o700)
        os.chdir(workdir)
        os.environ["HOME"] = workdir
    try:  # as bytes: a text file object costs the call ~0.15 ms more than the write
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except OSError:
        pass
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    rc = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        if exc.code is None:
            rc = 0
        elif isinstance(exc.code, int):
            rc = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            rc = 1
    except BaseException as exc:
        import traceback

        if isinstance(exc, MemoryError):
            try:
                os.write(3, b"M")
            except OSError:
                pass
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        rc = 1
    try:
        import atexit

        atexit._run_exitfuncs()
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(rc)


def _name(name):
    """The process's name (comm) as `ps` shows it: which of the container's processes is which."""
    if _LIBC is not None:
        _LIBC.prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _request_uid(req):
    uid = int(req.get("uid", EXEC_UID))
    if not UID_RANGE[0] <= uid < UID_RANGE[1]:
        os._exit(4)  # never root, never a system account
    return uid


class _Prepared:
    """A child, and its cleaner, forked ahead of the request (forking and dropping privileges are the
    dearest steps: milliseconds in a container): the child waits for the request on a pipe.

    With a spawner, both come from it (memory that never held a request or an output), and it reports
    their exits; without one (no root: one request per supervisor, and this child is forked before it is
    read) the child is forked from here."""

    def __init__(self, privileged, serial, spawner, uid):
        r_req, self.w_req = os.pipe()
        self.r_out, w_out = os.pipe()
        self.r_err, w_err = os.pipe()
        self.r_stat, w_stat = os.pipe()
        self.spawner = spawner
        self.cleaner_pid = self.w_go = None
        if spawner is None:
            self.pid = os.fork()
            if self.pid == 0:
                _child(r_req, w_out, w_err, w_stat, privileged, serial, uid)
            kept = (r_req, w_out, w_err, w_stat)
        else:
            self.pid = None  # known once the spawner answers (see forked())
            r_go, self.w_go = os.pipe()
            kept = (r_req, w_out, w_err, w_stat, r_go)
            socket.send_fds(spawner, [f"{uid} {serial}".encode()], list(kept))
        for fd in kept:
            os.close(fd)

    def _word(self, block=True):
        try:
            answer = self.spawner.recv(128, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        if not answer:
            os._exit(5)  # the spawner is gone: the host sees no exit record and retires the container
        return answer.split()

    def forked(self):
        """The child's pid (once the spawner has forked it and its cleaner)."""
        if self.pid is None:
            child, cleaner = (int(x) for x in self._word())
            self.pid, self.cleaner_pid = child, cleaner
        return self.pid

    def exited(self, block):
        """(wait status, CPU seconds) once the child has exited, else None (never when `block`)."""
        if self.spawner is None:
            done, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
            return (status, usage.ru_utime + usage.ru_stime) if done else None
        word = self._word(block)
        return None if word is None else (int(word[0]), float(word[1]))

    def cleaned(self, uid):
        """Tell the cleaner to go as `uid`; its wait status."""
        os.write(self.w_go, b"g%d" % uid)
        os.close(self.w_go)
        return int(self._word()[0])


def _start_spawner(privileged):
    """Fork the spawner before anything is read: every later process is forked from its clean memory."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        ours.close()
        devnull = os.open(os.devnull, os.O_RDWR)  # stays open: received pipe ends are never fds 0-4
        os.dup2(devnull, 0)  # never the host's requests ...
        os.dup2(devnull, 1)  # ... nor its output channel
        _name(b"spawner")
        try:
            _spawn_loop(theirs, privileged)
        finally:
            os._exit(0)  # whatever happened: a fork never returns into the supervisor's code
    theirs.close()
    return ours


def _spawn_loop(ctl, privileged):
    """The spawner: for each message (uid, serial and five pipe ends) fork a child and its cleaner, say
    their pids, then the child's exit (status, CPU seconds) and the cleaner's. Its parent, not the
    supervisor, waits for them: gVisor has no PR_SET_CHILD_SUBREAPER to hand them over."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 5)
        except OSError:
            return
        if not msg or len(fds) != 5 or min(fds) <= 4:
            return
        uid, serial = (int(x) for x in msg.split())
        r_req, w_out, w_err, w_stat, r_go = fds
        child = os.fork()
        if child == 0:
            ctl.close()
            os.close(r_go)
            _child(r_req, w_out, w_err, w_stat, privileged, serial, uid)
        cleaner = os.fork()
        if cleaner == 0:
            _cleaner(r_go)
        for fd in fds:
            os.close(fd)
        ctl.send(f"{child} {cleaner}".encode())
        _, status, usage = os.wait4(child, 0)
        ctl.send(f"{status} {usage.ru_utime + usage.ru_stime!r}".encode())
        _, status = os.waitpid(cleaner, 0)
        ctl.send(f"{status}".encode())


def _cleaner(r_go):
    """The cleaner: it stays root (out of the program's reach) until told to go with the execution uid,
    then becomes that uid and cleans up."""
    global EXEC_UID
    os.dup2(r_go, 0)
    os.closerange(1, 4096)
    _name(b"cleaner")
    try:
        word = os.read(0, 32)
        if word[:1] == b"g":
            EXEC_UID = int(word[1:])
            _clean()
    finally:
        os._exit(1)


def _execute(raw, prepared):
    """Hand one program to the prepared child; stream its output and send its exit record."""
    req = json.loads(raw)
    cap = int(req["output_bytes"])
    oom_before = _oom_kills()
    # The cleaner was forked with the child, before the program starts: a fork bomb cannot prevent it.
    pid, r_out, r_err, r_stat = prepared.forked(), prepared.r_out, prepared.r_err, prepared.r_stat
    view = memoryview(str(len(raw)).encode() + b"\n" + raw)
    try:
        while view:
            view = view[os.write(prepared.w_req, view):]
    except OSError:
        pass  # the child is gone: its exit status says how
    os.close(prepared.w_req)
    os.set_blocking(r_stat, False)
    kinds = {r_out: b"1", r_err: b"2"}
    sent = {r_out: 0, r_err: 0}
    truncated = False
    exited = None
    watch = [_WAKE_R] + ([prepared.spawner.fileno()] if prepared.spawner is not None else [])
    while kinds and exited is None:
        try:
            ready, _, _ = select.select(list(kinds) + watch, [], [])
        except InterruptedError:
            ready = []
        for fd in ready:
            if fd == _WAKE_R:
                os.read(_WAKE_R, 512)
                continue
            if fd in watch:
                continue  # the spawner's word on the child: read below
            chunk = os.read(fd, 65536)
            if not chunk:
                del kinds[fd]
                continue
            room = cap - sent[fd]
            if len(chunk) > room:
                chunk = chunk[:max(room, 0)]
                truncated = True
            if chunk:
                sent[fd] += len(chunk)
                _send(kinds[fd], chunk)
            if truncated:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                kinds.clear()
                break
        exited = prepared.exited(block=False)
    status, cpu = exited or prepared.exited(block=True)
    # The program exited; a background child may still hold the pipes: send what is there.
    for fd, kind in list(kinds.items()):
        os.set_blocking(fd, False)
        while sent[fd] < cap:
            try:
                chunk = os.read(fd, min(cap - sent[fd], 65536))
            except BlockingIOError:
                break
            if not chunk:
                break
            sent[fd] += len(chunk)
            _send(kind, chunk)
    try:
        memory_error = os.read(r_stat, 1) == b"M"
    except BlockingIOError:
        memory_error = False
    for fd in (r_out, r_err, r_stat):
        os.close(fd)
    record = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": cpu,
        "oom_kills": (_oom_kills() - oom_before) if oom_before >= 0 else -1,
        "truncated": truncated,
        "memory_error": memory_error,
    }
    _send(b"X", json.dumps(record).encode())


def _clean():
    """As the execution uid: kill every process of the uid, then remove everything it wrote."""
    _become_exec_uid(EXEC_UID)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)  # every process this uid may signal, this one excepted
        except ProcessLookupError:
            break
        except OSError:
            pass
        if not _exec_uid_processes(alive_only=True):
            break
        time.sleep(0.001)
    for top in WRITABLE:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            _remove(os.path.join(top, name))
    os._exit(0)


def _remove(path):
    try:
        st = os.lstat(path)
    except OSError:
        return
    if st.st_uid != EXEC_UID:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        try:
            os.chmod(path, 0o700)  # the program may have locked its own directory
            names = os.listdir(path)
        except OSError:
            names = []
        for name in names:
            _remove(os.path.join(path, name))
        try:
            os.rmdir(path)
        except OSError:
            pass
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _exec_uid_processes(alive_only):
    """The pids whose real uid is the execution uid, by /proc/PID/status."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = _read_small(f"/proc/{entry}/status")
        except OSError:
            continue
        uid = state = None
        for line in status.split(b"\n"):
            if line.startswith(b"Uid:"):
                uid = int(line.split()[1])
            elif line.startswith(b"State:"):
                state = line.split()[1]
        if uid == EXEC_UID and int(entry) != os.getpid() and not (alive_only and state == b"Z"):
            found.append(int(entry))
    return found


def _leftovers():
    """What of the execution uid survived the cleaner: None when nothing did."""
    deadline = time.monotonic() + SETTLE_S
    _reap_orphans()
    while _exec_uid_processes(alive_only=False):  # killed ones linger until they are reaped
        if time.monotonic() >= deadline:
            return "a process of the code survived the cleanup"
        time.sleep(0.001)
        _reap_orphans()
    for top in WRITABLE:
        try:
            if os.listdir(top):
                return f"files the cleanup could not remove are left in {top}"
        except OSError:
            continue
    kind = _sysv_ipc_left()
    return f"a SysV IPC object ({kind}) is left" if kind else None


def _sysv_ipc_left():
    """Which kind of SysV IPC object exists in the container (they outlive every process), if any.

    Asked of the kernel (SHM_INFO, MSG_INFO, SEM_INFO), not of /proc/sysvipc, which gVisor lacks."""
    if _LIBC is None:
        return "unknown: no libc"
    info = _ctypes.create_string_buffer(256)
    for kind, call, offset in (("shm", lambda: _LIBC.shmctl(0, 14, info), 0),   # shm_info.used_ids
                               ("msg", lambda: _LIBC.msgctl(0, 12, info), 0),   # msginfo.msgpool
                               ("sem", lambda: _LIBC.semctl(0, 0, 19, info), 28)):  # seminfo.semusz
        if call() < 0 or _ctypes.c_int.from_buffer(info, offset).value != 0:
            return kind
    return None


def _make_clean(prepared):
    status = prepared.cleaned(EXEC_UID)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return "the cleanup failed"
    return _leftovers()


def _load_libc():
    global _ctypes, _LIBC
    try:
        import ctypes

        _ctypes, _LIBC = ctypes, ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        _LIBC = None


def _become_subreaper():
    """Orphans of the program come to the supervisor, which reaps them at once (not to tini)."""
    if _LIBC is not None:
        _LIBC.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _warm_up():
    """The first compile() in a Python process costs ~1 ms of CPU (the parser sets itself up); paid once
    here, before anything is forked, it is not paid again by every execution. Constant code: nothing of a
    request."""
    compile("pass", "<warm-up>", "exec")


def main():
    global _WAKE_R, EXEC_UID
    privileged = os.geteuid() == 0
    if privileged:
        _load_libc()
    _warm_up()
    spawner = _start_spawner(privileged) if privileged else None
    _WAKE_R, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    if privileged:
        _become_subreaper()
    tenant = None
    uid = -1  # not known before the first request
    serial = 1
    prepared = _Prepared(privileged, serial, spawner, uid)
    while True:
        raw = _read_frame(0)
        if raw is None:
            return
        req = json.loads(raw)
        if tenant is None:
            tenant = req.get("tenant")
            uid = EXEC_UID = _request_uid(req) if privileged else EXEC_UID
        elif req.get("tenant") != tenant or (privileged and _request_uid(req) != uid):
            os._exit(4)  # a container never serves two tenants
        _execute(raw, prepared)
        problem = _make_clean(prepared) if privileged else "no privilege to separate executions"
        _send(b"R", json.dumps({"clean": problem is None, "problem": problem}).encode())
        if not privileged:
            # Stay until the host ends the sandbox: exiting here would take the process tree the host
            # measures with it before the host has read it.
            try:
                os.read(0, 1)
            except OSError:
                pass
            return
        serial += 1
        prepared = _Prepared(privileged, serial, spawner, uid)


_WAKE_R = -1
_ctypes = _LIBC = None
if __name__ == "__main__":  # `python3 -c <source>`; importing the file (a test listing modules) runs nothing
    main()
