"""Warm containers serve one tenant many times: each execution starts clean, and tenants never share one.

Against the real Docker engine, through the warm pool, on runc and on gVisor (runsc). A program
prints its container's hostname (unique per container) so each case can tell whether the next
execution ran in the same container (reused, and clean) or in another (the last one was retired).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import docker.errors
import pytest

from tests.fixtures_sandbox import RUNTIMES, labelled_containers, pool_executing, require_runtime, tiers_on
from tests.waiting import wait_for
from tools_sandbox import SandboxService, SandboxSettings

pytestmark = [pytest.mark.docker]

HOSTNAME = "import socket\nprint(socket.gethostname())\n"
# What the next execution sees: processes of another uid than root, /tmp, /dev/mqueue, free /tmp space.
LOOK = HOSTNAME + """import os
mine = os.getpid()
others = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != mine
                and os.stat(f'/proc/{p}').st_uid != 0)
st = os.statvfs('/tmp')
mqueue = os.listdir('/dev/mqueue') if os.path.isdir('/dev/mqueue') else []  # gVisor has none
print(others, sorted(n for n in os.listdir('/tmp') if not n.startswith('run-')), mqueue,
      st.f_bavail * st.f_frsize // (1 << 20))
"""


@pytest.fixture(scope="module", params=RUNTIMES)
def service(request, sandbox_image: str, docker_engine, tmp_path_factory):
    require_runtime(docker_engine, request.param)
    tiers_file = tmp_path_factory.mktemp(f"reuse-{request.param}") / "tiers.toml"
    tiers_file.write_text(tiers_on(request.param), encoding="utf-8")
    svc = SandboxService(SandboxSettings(sandbox_tiers_file=tiers_file, sandbox_pool_tiers="tiny,roomy"),
                         backend="docker")
    svc.start()
    assert svc.pool is not None and svc.pool.wait_ready(120), svc.start_error
    yield svc
    svc.close()
    assert labelled_containers(docker_engine, mine=True) == []


def run(service: SandboxService, code: str, tenant: str, tier: str = "roomy"):
    """On `roomy` (10 s wall time): under the parallel suite a program that forks and imports ctypes can pass
    tiny's 2 s under gVisor."""
    return service.execute(code, tier=tier, tenant=tenant)


def lines(result, n: int) -> list[str]:
    out = result.stdout.splitlines()
    assert len(out) == n, result
    return out


def look(service: SandboxService, tenant: str) -> tuple[str, list[int], list[str], list[str], int]:
    host, seen = lines(run(service, LOOK, tenant), 2)
    others, tmp, mqueue, free_mb = eval(f"({seen.replace('] ', '], ')})")  # noqa: S307 - our probe's own reprs
    return host, others, tmp, mqueue, free_mb


def test_a_planted_process_and_files_are_gone_in_the_same_tenants_next_execution(service) -> None:
    plant = HOSTNAME + """import os, signal, subprocess, time
# A process that ignores SIGTERM and leaves its group and session, a double-forked one, and a stopped one.
pid = os.fork()
if pid == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.setpgid(0, 0)
        time.sleep(300)
    os._exit(0)
# Its setsid must come before the stop: gVisor (unlike Linux) sends SIGHUP to this session's own group,
# stopped member and this program included, when a process leaves it while a member is stopped.
os.waitpid(pid, 0)
stopped = subprocess.Popen(['sleep', '300'])
os.kill(stopped.pid, signal.SIGSTOP)
os.makedirs('/tmp/deep/locked')
open('/tmp/deep/locked/secret', 'w').write('secret of acme')
os.chmod('/tmp/deep/locked', 0)
os.chmod('/tmp/deep', 0o500)
open('/tmp/.hidden', 'w').write('x')
os.mkfifo('/tmp/fifo')
os.symlink('/etc/passwd', '/tmp/link')
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
mq = libc.mq_open(b'/planted', os.O_CREAT | os.O_RDWR, 0o600, None)
print('planted', mq >= 0)
"""
    result = run(service, plant, "acme")
    host, said = lines(result, 2)
    assert said.startswith("planted") and result.error_kind is None, result
    again, others, tmp, mqueue, _ = look(service, "acme")
    assert again == host  # the same container served the tenant again ...
    assert (others, tmp, mqueue) == ([], [], [])  # ... with nothing of the last execution left


def test_filling_tmp_does_not_affect_the_next_execution(service) -> None:
    fill = HOSTNAME + ("import os\ntry:\n    with open('/tmp/fill', 'wb') as f:\n        while True:\n"
                       "            f.write(b'x' * (1 << 20))\nexcept OSError as exc:\n    print('full', exc.errno)")
    result = run(service, fill, "filler")
    host, said = lines(result, 2)
    assert said.split()[0] == "full", result
    again, _, tmp, _, free_mb = look(service, "filler")
    assert again == host and tmp == []
    assert free_mb >= service.tiers["roomy"].tmpfs_mb - 1  # the whole tmpfs is free again


def test_what_the_cleanup_cannot_remove_retires_the_container(service) -> None:
    # A SysV shared-memory segment outlives every process; the supervisor finds it and the host retires
    # the container instead of handing it to the tenant's next execution.
    plant = HOSTNAME + ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "print(libc.shmget(0x5eed, 4096, 0o1600) >= 0)")
    result = run(service, plant, "ipc")
    host, made = lines(result, 2)
    assert made == "True", result
    again = run(service, HOSTNAME, "ipc").stdout.strip()
    assert again != host and again.startswith("sandbox-")
    # counted once the supervisor's ready record said so (read after the call returned)
    wait_for("the container retired as unclean", lambda: service.pool.retired.get("unclean", 0) >= 1, 10,
             show=lambda _: dict(service.pool.retired))


def test_a_timeout_retires_the_container(service) -> None:
    host = run(service, HOSTNAME, "slow", tier="tiny").stdout.strip()
    assert run(service, "import time\ntime.sleep(60)", "slow", tier="tiny").timed_out  # the wall-clock deadline
    assert run(service, HOSTNAME, "slow", tier="tiny").stdout.strip() not in ("", host)


def test_tenants_never_share_a_container(service, docker_engine) -> None:
    """10 tenants, 50 concurrent callers, 4 calls each: every container serves exactly one tenant (on `roomy`,
    whose 10 s wall time 50 callers on a shared 2-core machine stay well within, under gVisor too)."""
    served: dict[str, set[str]] = defaultdict(set)
    failures: list[object] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        tenant = f"tenant-{i % 10}"
        for _ in range(4):
            result = run(service, HOSTNAME, tenant)
            with lock:
                if result.exit_code != 0:
                    failures.append(result)
                else:
                    served[result.stdout.strip()].add(tenant)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert failures == []
    assert sum(1 for _ in served) < 200  # containers were reused ...
    shared = {host: tenants for host, tenants in served.items() if len(tenants) != 1}
    assert shared == {}  # ... and never across tenants
    # The pool's own record agrees with what the programs saw: each idle container's hostname (from the
    # engine) belongs to the tenant the pool bound it to.
    for container_id, (tenant, _) in service.pool.bindings().items():
        if not tenant.startswith("tenant-"):
            continue
        hostname = docker_engine.api.inspect_container(container_id)["Config"]["Hostname"]
        assert served[hostname] == {tenant}, (hostname, tenant, served[hostname])


# The previous execution's secret, held in a local and printed. The probe below looks for any token of its
# shape (never this one: it does not know it) in its own frames, in every object the collector tracks and in
# every readable page of its own memory, and prints what it found.
HOLD_SECRET = HOSTNAME + 'API_TOKEN = "sk-live-{token}"\nprint(API_TOKEN)\nkept = [API_TOKEN * 2]\n'
FIND_SECRETS = HOSTNAME + r"""import ctypes, gc, re, sys
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a process that changed its uid may not open its own mem
shape = re.compile(rb"sk-" rb"live-([0-9a-f]{32})")
found = set()
def look(value):
    if isinstance(value, str):
        value = value.encode("utf-8", "replace")
    if isinstance(value, (bytes, bytearray)):
        found.update(m.decode() for m in shape.findall(value))
for frame in sys._current_frames().values():
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            look(value)
        frame = frame.f_back
for obj in gc.get_objects():
    for value in gc.get_referents(obj):
        look(value)
in_frames = len(found)
pages = 0
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        span, perms = line.split()[:2]
        if not perms.startswith("r") or line.rstrip().endswith(("[vvar]", "[vsyscall]", "[vvar_vclock]")):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        while start < end:
            size = min(end - start, 1 << 22)
            try:
                mem.seek(start)
                chunk = mem.read(size)
            except (OSError, ValueError, OverflowError):
                break
            pages += len(chunk) >> 12
            look(chunk)
            start += size
print(sorted(found), in_frames, pages > 0)
"""


def test_an_execution_holds_nothing_of_the_last_one_in_memory(service) -> None:
    """The next execution in the same warm container walks its frames and the collector's objects and scans
    its own readable memory: the previous execution's secret (its code and its output) is nowhere."""
    import secrets

    token = secrets.token_hex(16)
    held = run(service, HOLD_SECRET.format(token=token), "vault")
    host, said = lines(held, 2)
    assert said == f"sk-live-{token}", held
    probe = run(service, FIND_SECRETS, "vault")
    again, seen = lines(probe, 2)
    assert again == host  # the same warm container ...
    assert seen.endswith(" True"), probe  # ... whose probe did read its own memory ...
    assert token not in seen, seen  # ... and found no trace of the last execution


def _remove_my_containers(engine) -> int:
    """What an operator's `docker rm -f` (or a prune, or an engine restart) does to the pool's containers."""
    gone = 0
    for container in labelled_containers(engine, mine=True):
        try:
            engine.api.remove_container(container["Id"], force=True)
            gone += 1
        except docker.errors.NotFound:
            pass  # the pool retired it meanwhile
    return gone


def test_warm_containers_removed_from_outside_are_replaced_and_the_call_runs(service, docker_engine) -> None:
    """The tenant's idle bound container and every unbound one vanish between two calls: the next calls run
    in fresh containers, and the observation is the program's own output (not a protocol violation)."""
    first = run(service, HOSTNAME, "evicted").stdout.strip()
    assert first.startswith("sandbox-")
    assert service.pool.wait_ready(120)  # unbound ones are warm too, so a new tenant would take one of them
    assert _remove_my_containers(docker_engine) >= 2
    again = run(service, HOSTNAME + "print(6*7)", "evicted")  # its bound container is gone
    assert (again.error_kind, again.exit_code) == (None, 0), again
    host, said = lines(again, 2)
    assert host != first and host.startswith("sandbox-") and said == "42"
    newcomer = run(service, HOSTNAME + "print('hello')", "newcomer")  # the unbound ones are gone
    assert (newcomer.error_kind, newcomer.exit_code) == (None, 0), newcomer
    assert lines(newcomer, 2)[1] == "hello"
    assert service.pool.retired.get("gone", 0) >= 1, service.pool.retired  # found dead before its use


def test_a_container_removed_during_an_execution_runs_the_call_again(service, docker_engine) -> None:
    """The container goes while the program runs: the call runs again in another container and its result is
    the program's whole output, once (not a protocol violation, not `unavailable`)."""
    slow = HOSTNAME + "import time\ntime.sleep(3)\nprint('done')\n"
    removed: list[str] = []

    def remove_the_executing_one() -> None:
        for container_id in pool_executing(docker_engine, service.pool):
            try:
                hostname = docker_engine.api.inspect_container(container_id)["Config"]["Hostname"]
                docker_engine.api.remove_container(container_id, force=True)
            except docker.errors.NotFound:
                continue  # another of this process's containers, retired meanwhile
            removed.append(hostname)

    lost_before = service.pool.retired.get("lost", 0) + service.pool.retired.get("connection", 0)
    remover = threading.Thread(target=remove_the_executing_one)
    remover.start()
    result = run(service, slow, "interrupted")
    remover.join(60)
    assert removed, "nothing was removed"
    assert (result.error_kind, result.exit_code) == (None, 0), result
    host, said = lines(result, 2)
    assert said == "done" and host not in removed and host.startswith("sandbox-")
    lost = service.pool.retired.get("lost", 0) + service.pool.retired.get("connection", 0)
    assert lost == lost_before + 1, service.pool.retired  # the host's trouble, counted as such


def test_a_call_returns_with_its_exit_record_and_its_container_serves_again_once_clean(service) -> None:
    # Thousands of files: the supervisor's cleanup (the cleaner removes each) goes on after the exit record
    # (~0.3 s on runc, ~0.45 s under gVisor, on an idle machine; well under the 3 s it may take). The call has
    # returned by then; the container is not back in the pool until the ready record. The window must outlast
    # this thread's scheduling under the parallel suite: with 1,000 files under gVisor (~0.13 s) it once
    # did not, and the ready record was read with the exit record.
    files = 2500 if service.tiers["roomy"].runtime == "runsc" else 30000
    plant = HOSTNAME + f"for i in range({files}):\n    open(f'/tmp/f{{i}}', 'w').close()\nprint('planted')\n"
    host, said = lines(run(service, plant, "many-files"), 2)
    assert said == "planted"
    assert "many-files" not in {tenant for tenant, _ in service.pool.bindings().values()}  # still cleaning up
    again, others, tmp, mqueue, _ = look(service, "many-files")
    assert again == host  # the tenant's next execution waited for its own container ...
    assert (others, tmp, mqueue) == ([], [], [])  # ... and found nothing of the last one left
