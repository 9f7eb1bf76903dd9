"""The attack suite against a real Docker engine, through the warm pool, on runc and on gVisor (runsc).

Each case asserts the safe outcome. Tiers come from the test tiers file (`tiny`:
2 s wall, 1 s CPU, 64 MB, 32 pids, 8 KB output, 8 MB tmpfs) to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import resource
import threading

import pytest

from tests.fixtures_sandbox import RUNTIMES, labelled_containers, pool_executing, require_runtime, tiers_on
from tests.waiting import wait_for
from tools_sandbox import ErrorKind, SandboxService, SandboxSettings, render_result
from tools_sandbox.base.exec_uids import exec_uid
from tools_sandbox.base.render import PROTOCOL_VIOLATION_TEXT

pytestmark = [pytest.mark.docker]
SECRET = "hunter2-docker-secret-value"
# `tiny` allows 2 s; the programs below would run for 60 s or forever. A bound well above the deadline
# tells "killed at the deadline" from "ran to the end" without timing the machine.
KILLED_BY_THE_DEADLINE_MS = 15_000


@pytest.fixture(scope="module", params=RUNTIMES)
def service(request, sandbox_image: str, docker_engine, tmp_path_factory):
    """The warm pool on runc, then on gVisor (runsc): the whole suite runs on both."""
    require_runtime(docker_engine, request.param)
    tiers_file = tmp_path_factory.mktemp(request.param) / "tiers.toml"
    tiers_file.write_text(tiers_on(request.param), encoding="utf-8")
    os.environ["REACTQ_FAKE_SECRET"] = SECRET
    svc = SandboxService(SandboxSettings(sandbox_tiers_file=tiers_file), backend="docker")
    svc.start()
    assert svc.backend_name == "docker", svc.start_error
    assert svc.pool is not None and svc.pool.wait_ready(60)
    yield svc
    svc.close()
    os.environ.pop("REACTQ_FAKE_SECRET", None)
    # After the suite: no stray containers with the label.
    assert labelled_containers(docker_engine, mine=True) == []


def run(service: SandboxService, code: str, tenant: str = "t1", tier: str = "tiny"):
    return service.execute(code, tier=tier, tenant=tenant)


def test_trivial_snippet_from_the_pool(service) -> None:
    service.pool.wait_ready(30)
    r = run(service, "print(6*7)")
    assert (r.exit_code, r.stdout, r.stderr, r.error, r.backend) == (0, "42\n", "", None, "docker")


def test_fork_bomb(service) -> None:
    r = run(service, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    # runc: the pids cgroup stops the forks and the host kills the spinning rest at the deadline. gVisor:
    # RLIMIT_NPROC stops them, unless the processes first fill the tier's memory, which under gVisor also
    # holds its own kernel: then the OOM killer ends the whole sandbox.
    assert r.timed_out or (service.tiers["tiny"].runtime == "runsc" and r.oom_killed), r
    assert r.exit_code is None
    assert r.duration_ms < KILLED_BY_THE_DEADLINE_MS
    assert run(service, "print('alive')").stdout == "alive\n"


def test_memory_bomb_is_oom_killed(service) -> None:
    r = run(service, "x = bytearray(512 << 20)\nprint('survived')")
    assert r.oom_killed and "survived" not in r.stdout


def test_cpu_spin_times_out(service) -> None:
    r = run(service, "while True: pass")
    assert r.timed_out and r.duration_ms < KILLED_BY_THE_DEADLINE_MS


def test_sleep_past_the_deadline(service) -> None:
    r = run(service, "import time\ntime.sleep(60)\nprint('woke')")
    assert r.timed_out and r.exit_code is None and "woke" not in r.stdout
    assert 1900 <= r.duration_ms < KILLED_BY_THE_DEADLINE_MS


def test_filling_the_tmpfs_stops_at_its_size(service) -> None:
    code = ("n = 0\ntry:\n    for i in range(64):\n        with open(f'/tmp/f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (1 << 20))\n        n += 1\n"
            "except OSError as e:\n    print('stopped', e.errno, n)")
    r = run(service, code)
    assert r.stdout.startswith("stopped 28 "), r  # ENOSPC
    assert int(r.stdout.split()[-1]) <= 8


def test_writing_outside_the_tmpfs_fails(service) -> None:
    code = ("import json\nbad = []\nfor p in ['/x', '/etc/passwd', '/usr/bin/python3', '/root/x', '/home/x',\n"
            "          '/var/tmp/x', '/dev/shm/x', '/proc/x', '/sys/x', '/bin/x', '/run/x']:\n"
            "    try:\n        open(p, 'a').close(); bad.append(p)\n    except OSError:\n        pass\n"
            "print(json.dumps(bad))")
    r = run(service, code)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_output_flood_is_truncated_and_memory_flat(service) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run(service, "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)")
    assert r.truncated and len(r.stdout) <= 8192 and not r.timed_out
    # A hostile program that tries to bypass the supervisor's cap by writing raw frames to its stdout is
    # refused by the kernel (another uid); the frame parser's own cap is tested on bytes
    # (tests/test_sandbox_authority.py).
    # (The program's parent is the spawner; the supervisor, which holds the host's stream, is the spawner's.)
    forged = ("import os, struct\nstat = open(f'/proc/{os.getppid()}/stat').read()\n"
              "supervisor = int(stat.rsplit(')', 1)[1].split()[1])\n"
              "fd = os.open(f'/proc/{supervisor}/fd/1', os.O_WRONLY)\n"
              "os.write(fd, b'1' + struct.pack('>I', 2**31))\nchunk = b'z' * (1 << 20)\n"
              "for _ in range(200):\n    os.write(fd, chunk)")
    r2 = run(service, forged)
    assert "PermissionError" in r2.stderr and r2.stdout == "" and r2.exit_code == 1, r2
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert after - before < 50_000  # KiB: far less than the 200 MB sent


def test_no_network(service, redis_url: str) -> None:
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    code = ("import socket, os, json\nout = {}\n"
            f"for host, port in [('1.1.1.1', 53), ('127.0.0.1', {redis_port}), ('172.17.0.1', {redis_port}),\n"
            "                   ('10.0.2.2', 80)]:\n"
            "    try:\n        socket.create_connection((host, port), timeout=1)\n        out[host] = 'CONNECTED'\n"
            "    except OSError as e:\n        out[host] = e.errno\n"
            "try:\n    socket.getaddrinfo('example.com', 80)\n    out['dns'] = 'RESOLVED'\n"
            "except OSError as e:\n    out['dns'] = 'failed'\n"
            "out['ifaces'] = sorted(os.listdir('/sys/class/net'))\nprint(json.dumps(out))")
    r = run(service, code)
    out = json.loads(r.stdout)
    assert "CONNECTED" not in out.values() and out["dns"] == "failed"
    # Only loopback exists: nothing can leave the sandbox (network mode none).
    assert out["ifaces"] == ["lo"]
    assert out["1.1.1.1"] in (101, 113)  # ENETUNREACH (runc), EHOSTUNREACH (gVisor): no route, no packet


def test_host_env_and_secrets_are_not_visible(service) -> None:
    assert os.environ["REACTQ_FAKE_SECRET"] == SECRET
    code = ("import os, glob\nprint(dict(os.environ))\n"
            "for p in glob.glob('/proc/*/environ') + ['/proc/1/cmdline']:\n"
            "    try:\n        print(p, open(p, 'rb').read())\n    except OSError as e:\n        print(p, e)")
    r = run(service, code)
    assert SECRET not in r.stdout and "REACTQ_FAKE_SECRET" not in r.stdout
    assert "DOCKER_HOST" not in r.stdout and "REDIS" not in r.stdout


def test_no_docker_socket_and_no_host_mounts(service) -> None:
    code = ("import os, stat\nfound = []\nfor root, dirs, files in os.walk('/'):\n"
            "    if root.startswith(('/proc', '/sys')):\n        dirs[:] = []\n        continue\n"
            "    for f in files:\n        p = os.path.join(root, f)\n        try:\n"
            "            if stat.S_ISSOCK(os.lstat(p).st_mode) or f.endswith('.sock'):\n"
            "                found.append(p)\n"
            "        except OSError:\n            pass\nprint(found)\n"
            "print(open('/proc/self/mountinfo').read())")
    r = run(service, code, tier="roomy")  # walking the whole filesystem may take more than tiny's 2 s
    assert r.stdout.splitlines()[0] == "[]", r
    assert "docker.sock" not in r.stdout and "docker-init" not in r.stdout
    # Only the engine's own per-container files are bind mounts (hostname, hosts, resolv.conf).
    # (/proc and /sys paths are the engine's masks and the container's own cgroup.)
    binds = [line.split()[4] for line in r.stdout.splitlines()[1:]
             if line and line.split()[3] != "/" and not line.split()[4].startswith(("/proc", "/sys", "/dev"))]
    assert set(binds) <= {"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"}, binds


def test_not_root_and_no_capabilities(service) -> None:
    code = ("import ctypes, os\nprint(os.getuid(), os.geteuid(), os.getgid())\n"
            "st = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
            "no_new_privs = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS (gVisor's status lacks it)\n"
            "print(st['CapEff'], st['CapPrm'], st['CapBnd'], no_new_privs)")
    r = run(service, code)
    ids, caps = r.stdout.splitlines()
    uid = exec_uid("t1")  # the tenant's own uid, not the nobody every tenant shared
    assert ids == f"{uid} {uid} {uid}" and uid != 65534
    # No effective or permitted capability, no_new_privs. The bounding set keeps only the supervisor's
    # SETUID, SETGID and KILL (bits 5-7); with no capability left and no_new_privs nothing can regain them.
    assert caps == "0000000000000000 0000000000000000 00000000000000e0 1"


def test_the_spawner_is_out_of_reach(service) -> None:
    """The program's parent is the spawner (root, the container's three capabilities): it can neither stop,
    kill nor talk to it, and the spawner goes on forking the tenant's next executions."""
    code = ("import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\nspawner = os.getppid()\n"
            "print(open(f'/proc/{spawner}/comm').read().strip())\n"
            "print(libc.ptrace(16, spawner, None, None), ctypes.get_errno())  # PTRACE_ATTACH\n"
            "try:\n    os.kill(spawner, signal.SIGKILL)\nexcept PermissionError:\n    print('EPERM')\n"
            "try:\n    os.open(f'/proc/{spawner}/fd/4', os.O_RDWR)  # its socket to the supervisor\n"
            "except OSError:\n    print('refused')\n")
    r = run(service, code, tenant="reach")
    assert r.stdout.splitlines() == ["spawner", "-1 1", "EPERM", "refused"], r
    assert run(service, "print(6*7)", tenant="reach").stdout == "42\n"


HOSTNAME = "import socket\nprint(socket.gethostname())\n"
# Every process in the container with its uid and command, and what /tmp holds.
PROBE = HOSTNAME + (
    "import os\nprocs = []\nfor pid in os.listdir('/proc'):\n    if pid.isdigit() and int(pid) != os.getpid():\n"
    "        uid = os.stat(f'/proc/{pid}').st_uid\n"
    "        procs.append((uid, open(f'/proc/{pid}/cmdline','rb').read().split(b'\\0')[0].decode()))\n"
    "print(sorted(procs))\nprint(sorted(os.listdir('/tmp')), os.getcwd())")


def test_background_process_does_not_outlive_its_call(service, docker_engine) -> None:
    code = HOSTNAME + ("import subprocess\nsubprocess.Popen(['sleep', '300'])\n"
                       "open('/tmp/leftover', 'w').write('secret of t1')\nprint('started')")
    r = run(service, code, tenant="t1")
    host, said = r.stdout.splitlines()
    assert said == "started" and not r.timed_out  # the call did not wait for its child
    for tenant in ("t1", "t2"):  # the same tenant (in the same container), then another one
        seen = run(service, PROBE, tenant=tenant)
        probe_host, procs_line, tmp_line = seen.stdout.splitlines()
        assert (probe_host == host) == (tenant == "t1"), (tenant, host, probe_host)
        assert "sleep" not in seen.stdout and "leftover" not in seen.stdout, seen.stdout
        procs = eval(procs_line)  # noqa: S307 - our own probe's repr of a list
        # Only root's tini, supervisor, spawner and waiting cleaner besides the probe: no process of the code's uid.
        assert [uid for uid, _ in procs if uid != 0] == [], procs
        assert tmp_line.startswith("['run-") and tmp_line.count("run-") == 2, tmp_line  # only its own workdir
    # The background process is gone from every container, not merely out of the probe's sight.
    wait_for("the background process to be gone",
             lambda: [c["Id"][:12] for c in labelled_containers(docker_engine)
                      if any("sleep 300" in " ".join(p) for p in _processes(docker_engine, c["Id"]))],
             15, 0.2, until=lambda still_there: still_there == [])


def _processes(client, container_id: str) -> list[list[str]]:
    import docker.errors

    try:
        return client.api.top(container_id).get("Processes") or []
    except docker.errors.APIError:  # not running (any more)
        return []


# Run as root inside the container (by `docker exec`), standing in for a program that got past its uid: a frame
# of a kind the protocol does not have, written into the supervisor's stdout (the stream the host reads).
CORRUPT_THE_STREAM = (
    "import os\n"
    "sup = [p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1]"
    ".split()[1] == '1' and open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'python3')][0]\n"
    "fd = os.open(f'/proc/{sup}/fd/1', os.O_WRONLY)\n"
    "os.write(fd, b'Z' + (6).to_bytes(4, 'big') + b'forged')\n")


def test_a_corrupted_frame_stream_is_still_the_programs_protocol_violation(service, docker_engine) -> None:
    """Only what the program could do reaches the verdict: frames that break the protocol on a container that
    is still there are a protocol violation (the one sentence, no output), run once, never retried as the host's
    trouble (which a container that vanished is: tests/test_sandbox_reuse.py)."""
    code = HOSTNAME + "import time\ntime.sleep(4)\nprint('finished')\n"
    corrupted: list[str] = []

    def corrupt_the_executing_one() -> None:
        for container_id in pool_executing(docker_engine, service.pool):
            exec_id = docker_engine.api.exec_create(container_id, ["python3", "-c", CORRUPT_THE_STREAM], user="0")
            # Detached: the host kills the container on the bad frame, and under gVisor the exec's own end
            # is then never reported. Whether the frame landed is the verdict's to show.
            docker_engine.api.exec_start(exec_id["Id"], detach=True)
            corrupted.append(container_id)

    before = dict(service.pool.retired)
    corrupter = threading.Thread(target=corrupt_the_executing_one)
    corrupter.start()
    result = run(service, code, tenant="corrupted", tier="roomy")
    corrupter.join(60)
    assert len(corrupted) == 1, corrupted
    assert result.error_kind is ErrorKind.PROTOCOL_VIOLATION, result
    assert render_result(result).text == PROTOCOL_VIOLATION_TEXT
    assert (result.stdout, result.stderr, result.exit_code) == ("", "", None)
    retired = service.pool.retired
    assert retired.get("protocol", 0) == before.get("protocol", 0) + 1, retired
    assert (retired.get("lost", 0), retired.get("gone", 0)) == (before.get("lost", 0), before.get("gone", 0))


def test_the_sandbox_still_serves_after_the_attacks(service) -> None:
    r = run(service, "import numpy\nprint(int(numpy.arange(7).sum()))")
    assert r.stdout == "21\n" and r.error is None
