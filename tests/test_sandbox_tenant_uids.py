"""Tenants' sandboxes do not share a host uid, so they do not share per-user kernel limits.

Against the real Docker engine, on runc and on gVisor (runsc). Per-user limits such as inotify instances
(fs.inotify.max_user_instances, 128 by default) are counted per host uid across every container: while
every sandbox ran as uid 65534, one tenant holding 100 instances left another tenant only the rest. Each
tenant's code now runs as its own uid (tools_sandbox/base/exec_uids.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.fixtures_sandbox import RUNTIMES, require_runtime, tier_toml, tiers_on
from tests.waiting import wait_for
from tools_sandbox.base.exec_uids import EXEC_UID_BASE, EXEC_UID_SPAN, exec_uid
from tools_sandbox.base.tiers import parse_tiers

pytestmark = [pytest.mark.docker]

HELD = 100
WANTED = 120
# Open HELD inotify instances, say so with a file, and hold them until the test drops /tmp/release in.
HOLD = (f"import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"fds = [libc.inotify_init() for _ in range({HELD})]\nassert min(fds) >= 0, ctypes.get_errno()\n"
        "open('/tmp/held', 'w').close()\nwhile not os.path.exists('/tmp/release'):\n    time.sleep(0.05)\n"
        "print(len(fds))")
# How many inotify instances can this program open (up to WANTED)?
COUNT = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = []\nwhile len(fds) < {WANTED}:\n"
         "    fd = libc.inotify_init()\n    if fd < 0:\n        break\n    fds.append(fd)\nprint(len(fds))")


def test_tenants_get_distinct_uids_from_the_reserved_range() -> None:
    uids = {exec_uid(f"tenant-{i}") for i in range(1000)}
    assert len(uids) == 1000
    assert all(EXEC_UID_BASE <= uid < EXEC_UID_BASE + EXEC_UID_SPAN for uid in uids)
    assert exec_uid("acme") == exec_uid("acme") and 65534 not in uids


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_tenant_holding_inotify_instances_does_not_starve_another(runtime, docker_engine,
                                                                      sandbox_image: str) -> None:
    from tools_sandbox.backends.docker_backend import DockerBackend

    require_runtime(docker_engine, runtime)
    tier = parse_tiers(tiers_on(runtime, tier_toml("held", (3, 1000, 1000), wall_time_s=60, cpu_time_s=30,
                                                   memory_mb=128, nofile=512)))["held"]
    backend = DockerBackend(sandbox_image)
    backend.start()
    try:
        holder, bystander, sibling = (backend.create_sandbox(tier) for _ in range(3))
        held: list[object] = []
        holding = threading.Thread(target=lambda: held.append(backend.run(holder, HOLD, tenant="hoarder")))
        holding.start()
        wait_for("the hoarder to hold its inotify instances",
                 lambda: not holding.is_alive()
                 or _exit_code(docker_engine, holder.container_id, ["test", "-e", "/tmp/held"]) == 0, 60)
        other = backend.run(bystander, COUNT, tenant="bystander").result
        same = backend.run(sibling, COUNT, tenant="hoarder").result
        # Detached: the hoarder's program ends as soon as the file appears, and on gVisor an exec still attached
        # while that execution winds down once hung in the engine for good (its exit never reported).
        api = docker_engine.api  # type: ignore[attr-defined]
        api.exec_start(api.exec_create(holder.container_id, ["touch", "/tmp/release"])["Id"], detach=True)
        holding.join(60)
    finally:
        backend.close()
    assert held and held[0].result.stdout == f"{HELD}\n", held  # type: ignore[attr-defined]
    # Another tenant opens all it wants while the hoarder holds its instances ...
    assert other.stdout == f"{WANTED}\n", other
    if runtime == "runc":
        # ... while the hoarder's own second container shares its uid, and so its limit (the host kernel's:
        # gVisor counts inside each sandbox's own kernel).
        limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
        assert int(same.stdout) <= limit - HELD, (same, limit)


def _exit_code(client: object, container_id: str, argv: list[str]) -> int | None:
    api = client.api  # type: ignore[attr-defined]
    exec_id = api.exec_create(container_id, argv)["Id"]
    api.exec_start(exec_id)
    return api.exec_inspect(exec_id)["ExitCode"]
