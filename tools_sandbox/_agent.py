"""The in-sandbox agent: receives one program, runs it, streams its output back, exits.

This file is not imported by the host: its *source* is the container's (or bwrap's)
command (`python3 -c <source>`), so the image stays a plain Debian + python3 and
the agent always matches the host's version. Each agent serves exactly one
execution; the sandbox is destroyed afterwards, so nothing can leak to the next.

Why an agent instead of `docker exec`: an exec costs a runc setup (~60-90 ms); the
agent is already running, and forking the warm interpreter costs ~1 ms.

Wire format (stdin -> agent): ASCII decimal length + newline + ASCII JSON request
    {"code", "cpu_time_s", "output_bytes", "as_bytes" (optional), "nproc" (optional)}
(agent -> stdout): frames of 1 byte kind + 4-byte big-endian length + payload;
kind b"1" = program stdout, b"2" = program stderr, b"X" = JSON exit record.
The request is pure printable ASCII so it can never contain Docker's detach key
sequence (ctrl-p ctrl-q) on the attached stdin. The program may forge frames (it
can reach the agent); that only lies about its own result. Limits, timeouts and kills are enforced outside the sandbox.
"""

import json
import os
import resource
import select
import signal
import struct
import sys


def _read_request():
    digits = b""
    while not digits.endswith(b"\n"):
        c = os.read(0, 1)
        if not c or len(digits) > 12:
            os._exit(3)
        digits += c
    return json.loads(_read_exact(0, int(digits)))


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


def _oom_kills():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return -1


def _child(code, req, w_out, w_err, w_stat):
    signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(w_out, 1)
    os.dup2(w_err, 2)
    os.dup2(w_stat, 3)
    os.closerange(4, 4096)
    os.setsid()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    cpu = int(req["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if req.get("as_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (req["as_bytes"], req["as_bytes"]))
    if req.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (req["nproc"], req["nproc"]))
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
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


def main():
    req = _read_request()
    code = req["code"]
    cap = int(req["output_bytes"])
    oom_before = _oom_kills()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    r_stat, w_stat = os.pipe()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    pid = os.fork()
    if pid == 0:
        _child(code, req, w_out, w_err, w_stat)
    os.close(w_out)
    os.close(w_err)
    os.close(w_stat)
    os.set_blocking(r_stat, False)
    kinds = {r_out: b"1", r_err: b"2"}
    sent = {r_out: 0, r_err: 0}
    truncated = False
    status = None
    usage = None
    while kinds and status is None:
        try:
            ready, _, _ = select.select(list(kinds) + [wake_r], [], [])
        except InterruptedError:
            ready = []
        for fd in ready:
            if fd == wake_r:
                os.read(wake_r, 512)
                continue
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
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            status, usage = st, ru
    if status is None:
        _, status, usage = os.wait4(pid, 0)
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
    record = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "oom_kills": (_oom_kills() - oom_before) if oom_before >= 0 else -1,
        "truncated": truncated,
        "memory_error": memory_error,
    }
    _send(b"X", json.dumps(record).encode())
    # Stay until the host ends the sandbox (it closes stdin, then kills): exiting here would stop the
    # container and take its cgroup, the host's only CPU figure, with it before the host has read it.
    try:
        os.read(0, 1)
    except OSError:
        pass


main()
