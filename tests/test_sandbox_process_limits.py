"""The process backend caps a sandbox as a whole: one cgroup per execution whose memory and
process limits are the tier's, so forked children share one memory limit and a fork bomb stops at
pids.max; where no such cgroup can be made, the backend refuses, naming why.

Real programs under both confinements (bubblewrap and the util-linux unshare fallback), as root.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tools_sandbox.backends import cgroup as cgroup_module
from tools_sandbox.backends.process_backend import ProcessBackend
from tools_sandbox.base.errors import SandboxUnavailable, TierUnavailable
from tools_sandbox.base.models import ErrorKind, Tier

MB = 1024 * 1024
TIER = Tier.model_validate({
    "name": "limits", "cpus": 1, "memory_mb": 256, "wall_time_s": 20, "cpu_time_s": 10, "pids": 32,
    "output_bytes": 65536, "tmpfs_mb": 8,
    "quota": {"concurrent_executions": 1, "executions_per_minute": 1, "cpu_seconds_per_day": 1},
})
# Four children each fill 200 MB and hold it: 800 MB in all against the tier's 256 MB (with rlimits
# alone, 4 children held 830 MB). Each stays under the per-process RLIMIT_AS, so only a limit on the whole
# sandbox can stop them.
FORKED_HOGS = """
import os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)
        for j in range(0, len(block), 4096):
            block[j] = 1
        print("holds", i, time.monotonic(), flush=True)
        time.sleep(4)
        print("released", i, time.monotonic(), flush=True)
        os._exit(0)
    kids.append(pid)
for kid in kids:
    os.waitpid(kid, 0)
"""
FORK_BOMB = """
import os, resource, time
soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
print("nproc", soft == resource.RLIM_INFINITY or soft > 1000, flush=True)
n = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped", n, flush=True)
"""


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def backend(request):
    if os.geteuid() != 0:
        pytest.skip("the process backend's cgroup limits need root here")
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    b = ProcessBackend(confinement=request.param)
    b.start()
    yield b
    b.close()


def test_forked_children_share_the_tiers_memory_limit(backend) -> None:
    r = backend.execute(FORKED_HOGS, TIER)
    assert r.oom_killed and r.error_kind is ErrorKind.OOM, r
    assert r.memory_peak_bytes is not None and r.memory_peak_bytes <= TIER.memory_mb * MB, r.memory_peak_bytes
    # At most one child can hold its 200 MB at a time under 256 MB. The OOM killer may kill a child that
    # already holds (cgroup v1 kills one process), and another then fills: so no two children that held
    # to the end held at the same time, and never all four held.
    assert r.stdout.count("holds") < 4, r.stdout
    held: dict[str, list[float]] = {}
    for line in r.stdout.splitlines():
        _, child, at = line.split()
        held.setdefault(child, []).append(float(at))
    spans = sorted(times for times in held.values() if len(times) == 2)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), r.stdout


def test_a_fork_bomb_stops_at_the_tiers_pids_limit(backend) -> None:
    r = backend.execute(FORK_BOMB, TIER)
    # RLIMIT_NPROC is the host's (far above the tier's): what stopped the forks is the cgroup's pids.max.
    assert "nproc True" in r.stdout, (r.stdout, r.stderr)
    assert "stopped" in r.stdout, (r.stdout, r.stderr)
    assert 0 < int(r.stdout.split()[-1]) < TIER.pids
    assert not r.timed_out


def test_the_cgroup_reads_back_the_tiers_limits() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    made = cgroup_module.ProcessCgroup.create()
    assert made is not None
    try:
        assert made.limit(96 * MB, 12) == ""
        memory = "memory.max" if made._v2 else "memory.limit_in_bytes"
        assert (made._memory / memory).read_text().strip() == str(96 * MB)
        assert made._pids_dir is not None and (made._pids_dir / "pids.max").read_text().strip() == "12"
    finally:
        made.remove()


def test_without_a_cgroup_the_backend_refuses_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where no cgroup can be made (here: creation made to fail, as for a non-root worker): the
    backend does not start, and a started one refuses each call with a typed error naming the tier."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    started = ProcessBackend(confinement="bwrap")
    if os.geteuid() == 0:
        started.start()
    monkeypatch.setattr(cgroup_module.ProcessCgroup, "create", classmethod(lambda cls: None))
    with pytest.raises(SandboxUnavailable, match="cannot enforce any tier's memory and process limits.*cgroup"):
        ProcessBackend(confinement="bwrap").start()
    if os.geteuid() == 0:
        with pytest.raises(TierUnavailable, match="memory limit of 256 MB cannot be enforced") as refused:
            started.execute("print(1)", TIER)
        assert refused.value.tier == "limits"
        started.close()
