"""The warm pool's rule for a tenant whose containers are all out: wait for one of them, or take another.

Taking another costs a container build (the pool replaces a warm one it hands out), so a caller waits when
the first of its tenant's containers to come free is expected within a build, and only then.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tools_sandbox.backends.docker_backend import DockerSandbox
from tools_sandbox.backends.pool import WarmPool, waits_for_own
from tools_sandbox.base.models import TenantQuota, Tier


@pytest.mark.parametrize(("hold_s", "held", "build_s"), [
    (0.005, 0, 0.3),   # a quiet machine: executions of a few ms
    (0.25, 2, 0.45),   # a saturated one: holds and builds both grow; the first of 2 is out ~0.08 s more
    (0.25, 0, 0.45),   # the others of the tenant are still getting theirs
    (0.9, 3, 0.3),     # ~0.22 s for the first of 3
])
def test_a_tenant_waits_for_its_own_when_one_comes_free_within_a_build(hold_s: float, held: int,
                                                                        build_s: float) -> None:
    assert waits_for_own(hold_s, held, build_s)


@pytest.mark.parametrize(("hold_s", "held", "build_s"), [
    (5.0, 1, 0.3),     # long programs: each concurrent execution gets its own container
    (0.6, 0, 0.45),
    (1.2, 3, 0.3),     # the first of 3 is out ~0.3 s more: as long as a build
    (30.0, 15, 0.5),
])
def test_a_tenant_takes_another_container_when_its_own_are_out_for_longer_than_a_build(
        hold_s: float, held: int, build_s: float) -> None:
    assert not waits_for_own(hold_s, held, build_s)


# --- the pool's choice, on a stand-in engine whose builds take a set time ------------------------------------
# The real engine's containers are in test_sandbox_reuse.py and test_sandbox_pool_task.py; here only how long a
# build takes matters, and a real one cannot be made to take 1.5 s on purpose.

TIER = Tier(name="standard", cpus=1, memory_mb=256, wall_time_s=10, cpu_time_s=5, pids=32, output_bytes=4096,
            tmpfs_mb=16, quota=TenantQuota(concurrent_executions=4, executions_per_minute=60, cpu_seconds_per_day=100))


class TimedBuilds:
    """The engine calls the pool makes, with each container's build taking `build_s` (set as the test goes)."""

    def __init__(self, build_s: float) -> None:
        self.build_s = build_s
        self.built = itertools.count()

    def create_sandbox(self, tier: Tier) -> DockerSandbox:
        time.sleep(self.build_s)
        return DockerSandbox(container_id=f"c{next(self.built)}", tier=tier, sock=None, raw=None)  # type: ignore[arg-type]

    def alive(self, sandbox: DockerSandbox) -> bool:
        return True

    def destroy(self, sandbox: DockerSandbox) -> None:
        pass

    def check_runtime(self, tier: Tier) -> None:
        pass

    def reap_orphans(self) -> list[str]:
        return []


def test_a_tenants_callers_wait_for_the_container_one_of_them_is_getting() -> None:
    """Three calls of a tenant new to an emptied pool: the first waits for a builder, the others for that
    container to come free, however long the build takes; they bind one container between them, not one
    each as builds come out. (Before, the others waited at most two builds' *estimated* time: builds slower
    than estimated, as on a saturated machine, gave each caller a container of its own.)"""
    engine = TimedBuilds(build_s=0.02)
    pool = WarmPool(engine, {"standard": TIER}, {"standard": 4}, builders=2)  # type: ignore[arg-type]
    pool.start()
    try:
        assert pool.wait_ready(10)
        engine.build_s = 1.5  # from now on the builders replace what is taken slowly, two at a time
        others = [pool.acquire(TIER, f"other-{i}") for i in range(4)]  # every unbound one is taken
        used: list[str] = []

        def call() -> None:
            sandbox = pool.acquire(TIER, "acme")
            used.append(sandbox.container_id)
            time.sleep(0.1)  # the execution
            pool.release(sandbox)

        callers = [threading.Thread(target=call) for _ in range(3)]
        for caller in callers:
            caller.start()
            time.sleep(0.01)  # in this order
        for caller in callers:
            caller.join(timeout=30)
        assert len(used) == 3
        assert len(set(used)) == 1, used
        assert pool.ready_count("standard") >= 1  # the second build went back to the unbound ones
        for sandbox in others:
            pool.release(sandbox)
    finally:
        pool.close()


def test_a_tenants_caller_waits_for_its_container_that_is_cleaning_up_however_long_its_holds() -> None:
    """A call returns before its container's cleanup is read (PooledDocker). The tenant's next caller waits
    for that container, even when the tenant's holds are long (where it would otherwise take another: an
    unbound one is ready), and gets it once released."""
    engine = TimedBuilds(build_s=0.02)
    pool = WarmPool(engine, {"standard": TIER}, {"standard": 2}, builders=1)  # type: ignore[arg-type]
    pool.start()
    try:
        assert pool.wait_ready(10)
        first = pool.acquire(TIER, "acme")
        pool._hold_s = 30.0  # long programs: not waiting for a container in use
        pool.cleaning(first)
        threading.Timer(0.3, pool.release, args=[first]).start()  # its cleanup read 0.3 s later
        assert pool.ready_count("standard") >= 1  # another one is there to take
        second = pool.acquire(TIER, "acme")
        assert second.container_id == first.container_id
        pool.release(second)
        pool._hold_s = 30.0
        third = pool.acquire(TIER, "acme")  # in use, not cleaning up: another container at once
        fourth = pool.acquire(TIER, "acme")
        assert fourth.container_id != third.container_id
    finally:
        pool.close()


def test_a_tenants_callers_queued_behind_its_one_container_wait_past_two_builds() -> None:
    """Three more calls of a tenant line up behind its one container, each holding it a little longer than a
    build. The last of them waits about three holds: past two builds (where it used to take another container,
    a start the saturated machine paid for), within four. One container serves them all."""
    build_s, hold_s = 0.3, 0.345  # a wait of ~1.04 s for the third: 2 builds are 0.6 s, 4 are 1.2 s
    engine = TimedBuilds(build_s=0.02)
    pool = WarmPool(engine, {"standard": TIER}, {"standard": 2}, builders=1)  # type: ignore[arg-type]
    pool.start()
    try:
        assert pool.wait_ready(10)
        engine.build_s = build_s
        first = pool.acquire(TIER, "acme")
        pool._build_s, pool._hold_s = build_s, hold_s
        used: list[str] = []

        def call() -> None:
            sandbox = pool.acquire(TIER, "acme")
            used.append(sandbox.container_id)
            time.sleep(hold_s)  # the execution
            pool.release(sandbox)

        callers = [threading.Thread(target=call) for _ in range(3)]
        for caller in callers:
            caller.start()
        time.sleep(hold_s)
        pool.release(first)
        for caller in callers:
            caller.join(timeout=30)
        assert used == [first.container_id] * 3
    finally:
        pool.close()
