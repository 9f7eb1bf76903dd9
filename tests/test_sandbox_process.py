"""The process backend: weaker isolation, but the basic attacks still fail.

Every attack runs under both confinements: bubblewrap, and the util-linux unshare
fallback for hosts without bwrap (forced here with confinement="unshare", so both are
tested on a host that has bwrap).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tools_sandbox import load_tiers
from tools_sandbox.backends.process_backend import ProcessBackend, unshare_unavailable
from tools_sandbox.base.errors import SandboxUnavailable
from tools_sandbox.edges.service import SandboxService

NAMES = {"bwrap": "process", "unshare": "process-unshare"}
# `tiny` allows 2 s; the programs below would run for 60 s or forever. A bound well above the deadline
# tells "killed at the deadline" from "ran to the end" without timing the machine.
KILLED_BY_THE_DEADLINE_MS = 15_000


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def backend(request):
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    if request.param == "unshare" and os.geteuid() != 0:
        pytest.skip("the unshare confinement needs root")
    b = ProcessBackend(confinement=request.param)
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def tier(test_tiers_file: Path):
    return load_tiers(test_tiers_file)["tiny"]


def test_runs_and_names_itself(backend, tier) -> None:
    r = backend.execute("print(6*7)", tier)
    assert (r.exit_code, r.stdout, r.error) == (0, "42\n", None)
    assert r.backend == NAMES[backend.confinement]


def test_no_host_env_no_root_no_caps(backend, tier, monkeypatch) -> None:
    monkeypatch.setenv("REACTQ_FAKE_SECRET", "hunter2-process")
    code = ("import os,glob\nprint(os.getuid(), os.getgid())\nprint(sorted(os.environ))\n"
            "s=open('/proc/self/status').read()\nprint([l for l in s.splitlines() if l.startswith('CapEff')])\n"
            "for p in glob.glob('/proc/*/environ'):\n  print(open(p,'rb').read())")
    r = backend.execute(code, tier)
    assert r.exit_code == 0, r.stderr
    assert "hunter2" not in r.stdout and "REACTQ_FAKE_SECRET" not in r.stdout
    assert r.stdout.splitlines()[0] == "65534 65534"
    assert "CapEff:\\t0000000000000000" in r.stdout


def test_no_network(backend, tier) -> None:
    code = ("import socket\nfor a in [('1.1.1.1',53),('127.0.0.1',6379)]:\n  try:\n"
            "    socket.create_connection(a,timeout=1); print('CONNECTED', a)\n"
            "  except OSError as e: print('blocked', e.errno)\n"
            "try:\n  socket.getaddrinfo('example.com', 80); print('RESOLVED')\nexcept OSError: print('nodns')\n"
            "import os; print(os.listdir('/sys/class/net') if os.path.exists('/sys/class/net') else ['lo'])")
    r = backend.execute(code, tier)
    assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout and "nodns" in r.stdout


def test_host_filesystem_hidden_and_read_only(backend, tier) -> None:
    code = ("import os\nprint(sorted(os.listdir('/')))\nbad=[]\n"
            "for p in ['/usr/x','/x','/etc/x','/root/x']:\n  try:\n    open(p,'w'); bad.append(p)\n"
            "  except OSError: pass\nprint('writable', bad)\n"
            f"print(os.path.exists({str(Path.cwd())!r}), os.path.exists('/var/run/docker.sock'))")
    r = backend.execute(code, tier)
    assert "writable []" in r.stdout
    assert r.stdout.strip().endswith("False False")
    assert "'home'" not in r.stdout and "'etc'" not in r.stdout


def test_cpu_spin_and_sleep_are_stopped(backend, tier) -> None:
    spin = backend.execute("while True: pass", tier)
    assert spin.timed_out and spin.duration_ms < KILLED_BY_THE_DEADLINE_MS
    sleep = backend.execute("import time; time.sleep(60)", tier)
    assert sleep.timed_out and sleep.exit_code is None
    assert sleep.duration_ms < KILLED_BY_THE_DEADLINE_MS


def test_memory_bomb_and_output_flood(backend, tier) -> None:
    mem = backend.execute("x = bytearray(512 << 20)", tier)
    assert mem.oom_killed and mem.exit_code != 0
    flood = backend.execute("import sys\nwhile True: sys.stdout.write('x'*65536)", tier)
    assert flood.truncated and len(flood.stdout) <= tier.output_bytes


def test_tmpfs_is_capped_and_private(backend, tier) -> None:
    code = ("import errno\nn=0\ntry:\n  for i in range(100):\n    open(f'/tmp/f{i}','wb').write(b'x'*(1<<20)); n+=1\n"
            "except OSError as e: print('stopped', e.errno, n)")
    r = backend.execute(code, tier)
    assert "stopped" in r.stdout
    assert int(r.stdout.split()[-1]) <= tier.tmpfs_mb
    assert not any(p.startswith("f") and (Path("/tmp") / p).stat().st_uid == 65534 for p in os.listdir("/tmp")
                   if (Path("/tmp") / p).is_file() and p.startswith("f") and p[1:].isdigit())


def test_background_process_dies_with_the_call(backend, tier) -> None:
    r = backend.execute("import subprocess; subprocess.Popen(['sleep','300']); print('started')", tier)
    assert r.stdout == "started\n" and not r.timed_out  # the call did not wait for its child
    out = os.popen("ps -eo user:20,args | grep '[s]leep 300' | grep -c nobody").read().strip()
    assert out == "0"


def test_fork_bomb_is_contained(backend, tier) -> None:
    code = ("import os,time\nn=0\ntry:\n  for _ in range(10000):\n    if os.fork()==0:\n"
            "      time.sleep(30); os._exit(0)\n    n+=1\nexcept OSError as e: print('stopped', n)")
    r = backend.execute(code, tier)
    assert "stopped" in r.stdout, (r.stdout, r.stderr, r.error)
    assert int(r.stdout.split()[-1]) < tier.pids
    assert not r.timed_out  # the call did not wait for the sleeping children


def test_privilege_cannot_be_regained(backend, tier) -> None:
    code = ("import os,subprocess\n"
            "for cmd in (['mount','-t','tmpfs','x','/tmp'],['unshare','-r','true'],['hostname','evil']):\n"
            "  try: print(cmd[0], subprocess.run(cmd,capture_output=True).returncode)\n"
            "  except OSError as e: print(cmd[0], 'missing')\n"
            "s=open('/proc/self/status').read().splitlines()\n"
            "print([l for l in s if l.startswith(('NoNewPrivs','CapBnd','CapAmb','CapPrm'))])\n"
            "print(open('/proc/sys/kernel/hostname').read().strip())")
    r = backend.execute(code, tier)
    assert r.exit_code == 0, r.stderr
    assert "mount 0" not in r.stdout and "hostname 0" not in r.stdout
    for cap in ("CapBnd", "CapAmb", "CapPrm"):
        assert f"{cap}:\\t0000000000000000" in r.stdout, r.stdout
    assert r.stdout.strip().endswith("sandbox")


def test_confinement_from_the_environment(monkeypatch, test_tiers_file: Path) -> None:
    """REACTQ_SANDBOX_PROCESS_CONFINEMENT reaches the backend the service builds."""
    if os.geteuid() != 0:
        pytest.skip("the unshare confinement needs root")
    from tools_sandbox.base.config import SandboxSettings

    monkeypatch.setenv("REACTQ_SANDBOX_PROCESS_CONFINEMENT", "unshare")
    with SandboxService(SandboxSettings(sandbox_tiers_file=test_tiers_file), backend="process", pool=False) as svc:
        r = svc.execute("print('hi')", tier="tiny")
    assert (r.stdout, r.backend, r.error) == ("hi\n", "process-unshare", None)


def test_auto_falls_back_to_unshare_without_bwrap(monkeypatch, tmp_path: Path, tier) -> None:
    """A host without bwrap (hidden from PATH here): auto picks unshare; bwrap forced is refused clearly."""
    if os.geteuid() != 0:
        pytest.skip("the unshare confinement needs root")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        ProcessBackend(confinement="bwrap").start()
    b = ProcessBackend(confinement="auto")
    b.start()
    try:
        r = b.execute("print(6*7)", tier)
    finally:
        b.close()
    assert (r.stdout, r.backend, r.error) == ("42\n", "process-unshare", None)


def test_without_root_unshare_is_refused_with_a_reason() -> None:
    why = unshare_unavailable(1000)
    assert "root" in why and "unshare" in why
    if os.geteuid() == 0:
        assert unshare_unavailable(0) == ""


def test_unknown_confinement_is_refused() -> None:
    with pytest.raises(ValueError, match="confinement"):
        ProcessBackend(confinement="chroot").start()
