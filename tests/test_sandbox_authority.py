"""The host is the only authority: forged reports, tampering with the supervisor, orphaned CPU burners.

Against the real Docker engine (one-shot containers and the warm pool) and the process backend
(bubblewrap). In a Docker sandbox the program runs as another uid than the supervisor, without
capabilities, and holds none of its file descriptors: every tampering attempt is refused by the
kernel (an ordinary PermissionError in the program), and the supervisor's honest report is the
result. Where a program does reach its agent (bubblewrap, killing it), the model sees exactly
the one protocol-violation sentence. Either way no sandbox is left running past its call that
should not be, and the `unavailable` outcome (the infrastructure's) is not counted.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.fixtures_sandbox import TEST_TIERS, require_runtime, tier_toml, tiers_on
from tests.waiting import wait_for
from tools_sandbox import ErrorKind, SandboxResult, SandboxService, SandboxSettings, load_tiers, render_result
from tools_sandbox.base.protocol import FrameParser, parse_exit_record
from tools_sandbox.base.render import PROTOCOL_VIOLATION_TEXT

GRACE_S = SandboxSettings().sandbox_sweep_grace_s
VALID = {"exit_code": 0, "signal": None, "cpu_s": 0.0, "oom_kills": 0, "truncated": False, "memory_error": False}

# The agent (the supervisor): the program's parent, or under Docker the parent of the spawner that forked it.
FIND_AGENT = """
import os
def agent():
    pid = os.getppid()
    if open("/proc/%d/comm" % pid).read().strip() == "spawner":
        pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    return pid
"""
# Writes one frame straight into the agent's stdout (the channel the host reads), as a hostile program would.
FORGE = FIND_AGENT + """
import os, struct
payload = {payload!r}
fd = os.open(f"/proc/{{agent()}}/fd/1", os.O_WRONLY)
os.write(fd, b"X" + struct.pack(">I", len(payload)) + payload)
"""
PTRACE_STOP = FIND_AGENT + """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace(16, agent(), None, None)  # PTRACE_ATTACH: the agent stops, and stays stopped when we exit
"""
PTRACE = FIND_AGENT + """
import ctypes, os, struct
payload = b'{"signal": 9, "cpu_s": "a", "oom_kills": "x"}'
fd = os.open(f"/proc/{agent()}/fd/1", os.O_WRONLY)
os.write(fd, b"X" + struct.pack(">I", len(payload)) + payload)
""" + PTRACE_STOP
RAW_WRITE = FIND_AGENT + """
import os
fd = os.open(f"/proc/{agent()}/fd/1", os.O_WRONLY)
os.write(fd, b"hello, agent")
"""
REDIRECT_STDOUT = FIND_AGENT + """
import os, sys
os.close(1)
os.open(f"/proc/{agent()}/fd/1", os.O_WRONLY)  # takes fd 1: our prints now go into the frame stream
print("forged answer: 42", flush=True)
"""
KILL_AGENT = FIND_AGENT + """
import os, signal
os.kill(agent(), signal.SIGKILL)
"""

TAMPERING = {
    "record_not_a_dict": FORGE.format(payload=b"1"),
    "record_nested_past_the_recursion_limit": FORGE.format(payload=b"[" * 5000 + b"]" * 5000),
    "record_nested_within_the_size_cap": FORGE.format(payload=b"[" * 400 + b"]" * 400),
    "record_with_wrong_types": FORGE.format(payload=b'{"signal": 9, "cpu_s": "a", "oom_kills": "x"}'),
    "ptrace_of_the_agent": PTRACE,
    "raw_write_to_the_agents_stdout": RAW_WRITE,
    "stdout_closed_and_redirected_to_the_agent": REDIRECT_STDOUT,
    "agent_killed": KILL_AGENT,
}

BURN_TIER = """
[tiers.burn]
cpus = 1.0
memory_mb = 128
wall_time_s = 30
cpu_time_s = 20
pids = 32
output_bytes = 8192
tmpfs_mb = 8
pool_size = 0

[tiers.burn.quota]
concurrent_executions = 2
executions_per_minute = 100
cpu_seconds_per_day = 1.0
"""
# Tiers that name runtimes of their own (left as they are in the gVisor variant of the tiers file).
RUNTIME_TIERS = (
    tier_toml("gvisor", (2, 100, 100), runtime="runsc-not-installed", pool_size=1)
    + tier_toml("prefers_gvisor", (2, 100, 100), memory_mb=128, wall_time_s=5, prefer_runtime="runsc")
    + tier_toml("prefers_missing", (2, 100, 100), prefer_runtime="runsc-not-installed"))

# A double-forked grandchild burns CPU while its parent only waits: the agent's wait4 sees ~0 s.
ORPHAN_BURNER = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        t = time.process_time()
        while time.process_time() - t < 1.5:
            pass
        os.write(w, b"done")
        os._exit(0)
    os._exit(0)
os.wait()
os.close(w)
os.read(r, 4)
print("parent idle, orphan done")
"""


def _unavailable(tier: str) -> float:
    return REGISTRY.get_sample_value("reactq_sandbox_executions_total", {"tier": tier, "outcome": "unavailable"}) or 0.0


def _cpu_counted(tier: str, tenant: str) -> float:
    return REGISTRY.get_sample_value("reactq_sandbox_cpu_seconds_total", {"tier": tier, "tenant": tenant}) or 0.0


@pytest.fixture(scope="module")
def authority_tiers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("authority") / "tiers.toml"
    path.write_text(TEST_TIERS + BURN_TIER + RUNTIME_TIERS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gvisor_tiers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiers, each requiring gVisor (runsc)."""
    path = tmp_path_factory.mktemp("authority-runsc") / "tiers.toml"
    path.write_text(tiers_on("runsc", TEST_TIERS + BURN_TIER) + RUNTIME_TIERS, encoding="utf-8")
    return path


def _settings(tiers_file: Path, **kw: object) -> SandboxSettings:
    return SandboxSettings(sandbox_tiers_file=tiers_file, tenants=["acme"], **kw)


@pytest.fixture(scope="module", params=["docker", "docker-runsc", "process"])
def one_shot(request, authority_tiers: Path, docker_engine):
    """A service that starts a fresh sandbox per call (docker: no pool), on each backend and runtime."""
    if request.param == "process" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    tiers_file = authority_tiers
    if request.param.startswith("docker"):
        request.getfixturevalue("sandbox_image")
    if request.param == "docker-runsc":
        require_runtime(docker_engine, "runsc")
        tiers_file = request.getfixturevalue("gvisor_tiers")
    svc = SandboxService(_settings(tiers_file), backend=request.param.split("-")[0], pool=False)
    svc.start()
    assert svc.backend_name in ("docker", "process"), svc.start_error
    yield svc
    svc.close()


def _my_running_containers(engine) -> list[dict]:
    from tools_sandbox.backends.owners import owner_id

    return engine.api.containers(filters={"label": f"reactq.sandbox.owner={owner_id()}", "status": "running"})


def _assert_none_running_within(engine, seconds: float) -> None:
    """The host killed the sandbox before returning; the engine's own bookkeeping may lag a moment."""
    wait_for("none of this test's sandbox containers to be running after the call",
             lambda: [c["Id"][:12] for c in _my_running_containers(engine)], seconds, 0.05,
             until=lambda running: running == [])


def _assert_discarded(result: SandboxResult) -> None:
    assert result.error_kind is ErrorKind.PROTOCOL_VIOLATION, result
    assert render_result(result).text == PROTOCOL_VIOLATION_TEXT
    assert (result.stdout, result.stderr, result.exit_code) == ("", "", None)
    assert "Error:" not in (result.error or "") and "Traceback" not in (result.error or "")


# -- the exit record parser, on bytes ------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"1", b"[" * 5000 + b"]" * 5000, b"[" * 400 + b"]" * 400, b'{"a":' * 200 + b"1" + b"}" * 200,
    b'{"signal": 9, "cpu_s": "a", "oom_kills": "x"}', json.dumps({**VALID, "cpu_s": -1}).encode(),
    json.dumps({**VALID, "exit_code": True}).encode(), json.dumps({**VALID, "extra": 1}).encode(),
    json.dumps({**VALID, "cpu_s": float("nan")}).encode(), b"\xff\xfe", b"{}", b"",
])
def test_anything_but_a_valid_record_is_refused_without_raising(raw: bytes) -> None:
    assert parse_exit_record(raw) is None


def test_a_valid_record_parses() -> None:
    record = parse_exit_record(json.dumps({**VALID, "signal": 9, "cpu_s": 1.5}).encode())
    assert record is not None and record.signal == 9 and record.cpu_s == 1.5


def test_the_frame_parser_turns_a_hostile_record_into_a_protocol_error() -> None:
    parser = FrameParser(cap=1024)
    payload = b"[" * 900 + b"]" * 100
    parser.feed(b"X" + struct.pack(">I", len(payload)) + payload)
    assert parser.exit is None and parser.protocol_error


# -- real sandboxes ------------------------------------------------------------------------

def _assert_refused(result: SandboxResult) -> None:
    """The attack failed inside the sandbox: an ordinary error of the program, honestly reported."""
    assert "PermissionError" in result.stderr, result
    assert result.exit_code == 1 and result.error_kind is None and result.error is None, result


@pytest.mark.docker
@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampering_with_the_report_is_refused_or_discarded(one_shot: SandboxService, docker_engine,
                                                           case: str) -> None:
    before = _unavailable("tiny")
    result = one_shot.execute(TAMPERING[case], tier="tiny", tenant="acme")
    if one_shot.backend_name == "process" and case == "agent_killed":
        _assert_discarded(result)  # bubblewrap's agent shares its program's uid: it can be killed
    else:
        _assert_refused(result)
    assert _unavailable("tiny") == before
    _assert_none_running_within(docker_engine, one_shot.tiers["tiny"].wall_time_s + GRACE_S)
    assert result.cpu_seconds is not None  # the host measured it, whatever the program claimed


@pytest.mark.docker
def test_a_ptrace_of_the_agent_is_refused_or_ended_by_the_host_at_the_time_limit(one_shot: SandboxService,
                                                                                 docker_engine) -> None:
    before = _unavailable("tiny")
    result = one_shot.execute(PTRACE_STOP + "print(ctypes.get_errno())", tier="tiny", tenant="acme")
    if one_shot.backend_name == "docker":  # another uid, no CAP_SYS_PTRACE: EPERM
        assert result.stdout == "1\n" and result.exit_code == 0 and result.error_kind is None, result
    else:  # bubblewrap: the agent stops; the host ends the sandbox at the deadline
        assert result.error_kind is ErrorKind.TIMEOUT and result.timed_out and result.exit_code is None, result
        assert render_result(result).text.startswith("Error: the code was stopped at the time limit of its tier")
    assert _unavailable("tiny") == before
    _assert_none_running_within(docker_engine, one_shot.tiers["tiny"].wall_time_s + GRACE_S)


@pytest.mark.docker
def test_tampering_through_the_warm_pool(authority_tiers: Path, sandbox_image: str, docker_engine) -> None:
    settings = _settings(authority_tiers, sandbox_pool_tiers="tiny")
    with SandboxService(settings, backend="docker") as svc:
        assert svc.pool is not None and svc.pool.wait_ready(60)
        for case in sorted(TAMPERING):
            _assert_refused(svc.execute(TAMPERING[case], tier="tiny", tenant="acme"))
        # The supervisor was untouched: the tenant's warm container still serves honest code.
        assert svc.execute("print(6*7)", tier="tiny", tenant="acme").stdout == "42\n"
        assert svc.pool.reuses >= len(TAMPERING)


def _running(engine, cid: str) -> bool:
    return bool(engine.api.containers(filters={"id": cid, "status": "running"}))


@pytest.mark.docker
def test_a_forged_zero_cpu_claim_is_not_believed(one_shot: SandboxService) -> None:
    code = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"
            + FORGE.format(payload=json.dumps(VALID).encode()))
    result = one_shot.execute(code, tier="roomy", tenant="acme")
    # The forgery cannot reach the supervisor: an ordinary PermissionError, after the CPU was spent.
    assert result.error_kind is None and result.exit_code == 1
    assert result.cpu_seconds is not None and result.cpu_seconds >= 0.45, result
    assert result.memory_peak_bytes is not None  # measured in the sandbox's cgroup, not estimated


@pytest.mark.docker
def test_an_orphaned_cpu_burner_is_charged_and_the_quota_then_refuses(
        one_shot: SandboxService, redis_url: str) -> None:
    counted = _cpu_counted("burn", "acme")
    tiers_file = one_shot.settings.sandbox_tiers_file
    # The burner spins for 1.5 s of its own CPU clock. Under gVisor that clock is gVisor's kernel's, which
    # runs ahead of what the host's cgroup measures (1.29 s seen): the host's figure is the one charged.
    burnt = 1.0 if load_tiers(tiers_file)["burn"].runtime == "runsc" else 1.4
    with SandboxService(_settings(tiers_file), backend=one_shot.backend_name, redis_url=redis_url,
                        pool=False) as svc:
        first = svc.execute(ORPHAN_BURNER, tier="burn", tenant="acme")
        assert first.stdout == "parent idle, orphan done\n" and first.error_kind is None, first
        assert first.cpu_seconds is not None and first.cpu_seconds >= burnt, first
        assert first.memory_peak_bytes is not None  # the cgroup's figure, not the wall-time estimate
        second = svc.execute("print(1)", tier="burn", tenant="acme")
    assert second.error_kind is ErrorKind.QUOTA_EXCEEDED and second.quota == "cpu_seconds_per_day", second
    assert "cpu_seconds_per_day" in render_result(second).text
    assert _cpu_counted("burn", "acme") >= counted + burnt


@pytest.mark.docker
def test_a_tier_whose_runtime_is_missing_fails_closed(one_shot: SandboxService, docker_engine) -> None:
    before = len(docker_engine.api.containers(all=True, filters={"label": "reactq.sandbox.tier=gvisor"}))
    result = one_shot.execute("print('on runc?')", tier="gvisor", tenant="acme")
    assert result.error_kind is ErrorKind.UNAVAILABLE and result.exit_code is None and result.stdout == ""
    assert "runsc-not-installed" in (result.error or "")
    assert len(docker_engine.api.containers(all=True, filters={"label": "reactq.sandbox.tier=gvisor"})) == before


@pytest.mark.docker
def test_the_warm_pool_never_builds_a_tier_whose_runtime_is_missing(authority_tiers: Path, sandbox_image: str,
                                                                     docker_engine) -> None:
    with SandboxService(_settings(authority_tiers, sandbox_pool_tiers="gvisor,tiny"), backend="docker") as svc:
        assert svc.pool is not None and svc.pool.wait_ready(60)
        assert "gvisor" not in svc.pool.sizes and svc.pool.ready_count("gvisor") == 0
        result = svc.execute("print(1)", tier="gvisor", tenant="acme")
        assert result.error_kind is ErrorKind.UNAVAILABLE and "runsc-not-installed" in (result.error or "")


@pytest.mark.docker
def test_a_preferred_runtime_is_used_where_the_engine_has_it_and_runc_elsewhere(
        authority_tiers: Path, sandbox_image: str, docker_engine) -> None:
    from tools_sandbox.backends.docker_backend import DockerBackend

    require_runtime(docker_engine, "runsc")
    tiers = load_tiers(authority_tiers)
    backend = DockerBackend(sandbox_image)
    backend.start()
    try:
        for name, expected in (("prefers_gvisor", "runsc"), ("prefers_missing", "runc")):
            sandbox = backend.create_sandbox(tiers[name])
            runtime = docker_engine.api.inspect_container(sandbox.container_id)["HostConfig"]["Runtime"]
            executed = backend.run(sandbox, "print(6*7)", tenant="acme")
            backend.destroy(sandbox)
            assert (runtime, executed.result.stdout) == (expected, "42\n"), (name, executed)
    finally:
        backend.close()


def test_the_production_default_backend_is_docker(monkeypatch) -> None:
    for key in list(os.environ):
        if key.startswith("REACTQ_"):
            monkeypatch.delenv(key)
    assert SandboxSettings().sandbox_backend == "docker"  # the sandbox workers' (the step workers have none)


def test_docker_backend_without_an_engine_is_unavailable_not_process(monkeypatch, authority_tiers: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with SandboxService(_settings(authority_tiers), backend="docker", pool=False) as svc:
        result = svc.execute("print(1)", tier="tiny", tenant="acme")
    assert result.error_kind is ErrorKind.UNAVAILABLE and result.backend == "docker" and result.stdout == ""


def test_auto_without_an_engine_names_the_weaker_isolation(monkeypatch, authority_tiers: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with SandboxService(_settings(authority_tiers), backend="auto", pool=False) as svc:
        result = svc.execute("print(1)", tier="tiny", tenant="acme")
    assert result.stdout == "1\n" and result.backend == "process"


def test_tiers_file_may_name_a_runtime(authority_tiers: Path) -> None:
    assert load_tiers(authority_tiers)["gvisor"].runtime == "runsc-not-installed"


@pytest.mark.docker
def test_without_a_view_of_the_cgroup_the_engine_measures_and_kills(sandbox_image: str, authority_tiers: Path,
                                                                     docker_engine) -> None:
    """A remote engine (dind): no local cgroup or pidfd, so the stats API measures and the API kills."""
    from tools_sandbox.backends.docker_backend import DockerBackend

    backend = DockerBackend(sandbox_image)
    backend.start()
    try:
        sandbox = backend.create_sandbox(load_tiers(authority_tiers)["roomy"])
        assert sandbox.meter is not None  # this engine is local; pretend it is not
        sandbox.meter.close()
        sandbox.meter = None
        code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\nprint('spun')"
        executed = backend.run(sandbox, code)
        result = executed.result
        assert not executed.reusable  # unmeasurable between executions: one execution per container
        assert result.stdout == "spun\n" and result.error_kind is None, result
        assert result.cpu_seconds is not None and result.cpu_seconds >= 0.25, result
        assert not _running(docker_engine, sandbox.container_id)
    finally:
        backend.close()
