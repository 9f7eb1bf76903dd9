"""The sweeper: labelled containers past their limits are killed and removed, whoever started them.

The policy is pure and tested on data; then a real engine: a leaked running container, one created
and never started, and one whose owner is a dead process are swept and counted, while the pool's own
idle warm containers are left alone.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.fixtures_sandbox import TEST_TIERS
from tests.waiting import wait_for
from tools_sandbox import SandboxService, SandboxSettings
from tools_sandbox.base.sweeper import UNKNOWN_TIER_CAP_S, ReapReason, SweepPolicy
from tools_sandbox.base.tiers import parse_tiers

SWEEP_TIER = """
[tiers.sweep]
cpus = 0.5
memory_mb = 64
wall_time_s = 1
cpu_time_s = 1
pids = 16
output_bytes = 4096
tmpfs_mb = 4
max_idle_s = 1
max_age_s = 1
pool_size = 0

[tiers.sweep.quota]
concurrent_executions = 1
executions_per_minute = 10
cpu_seconds_per_day = 10
"""
NOW = 1_000_000.0


def policy() -> SweepPolicy:
    return SweepPolicy(parse_tiers(TEST_TIERS + SWEEP_TIER), grace_s=5, default_max_idle_s=600)


def container(age: float, *, tier: str = "tiny", state: str = "running") -> dict:
    return {"Id": "c", "Created": NOW - age, "State": state, "Labels": {"reactq.sandbox.tier": tier}}


def verdict(c: dict, *, executing_for: float | None = None, owner_alive: bool = True) -> ReapReason | None:
    since = None if executing_for is None else NOW - executing_for
    return policy().verdict(c, now=NOW, executing_since=since, owner_alive=owner_alive)


def test_an_idle_warm_container_is_not_swept_for_its_age_until_past_max_idle() -> None:
    assert verdict(container(300)) is None  # tiny: wall 2 s, but idle in a pool: fine
    assert verdict(container(600 + 2 + 5 - 1)) is None
    assert verdict(container(600 + 2 + 5 + 1)) is ReapReason.EXPIRED


def test_an_execution_past_wall_time_and_grace_is_overran() -> None:
    assert verdict(container(100), executing_for=2 + 5 - 0.5) is None
    assert verdict(container(100), executing_for=2 + 5 + 0.5) is ReapReason.OVERRAN


def test_a_dead_owners_container_is_an_orphan_at_once() -> None:
    assert verdict(container(0.5), owner_alive=False) is ReapReason.ORPHAN


def test_stopped_containers_are_leftovers_after_the_grace_since_they_stopped() -> None:
    old_but_just_stopped = container(900, state="exited")
    assert policy().verdict(old_but_just_stopped, now=NOW, executing_since=None, owner_alive=True,
                            stopped_at=NOW - 1) is None
    assert policy().verdict(old_but_just_stopped, now=NOW, executing_since=None, owner_alive=True,
                            stopped_at=NOW - 6) is ReapReason.LEFTOVER
    # When the engine cannot say when it stopped: by age, like a container that never started.
    assert verdict(container(6, state="exited")) is None
    assert verdict(container(8, state="exited")) is ReapReason.LEFTOVER
    assert verdict(container(8, state="created")) is ReapReason.LEFTOVER


def test_a_tier_this_worker_does_not_know_gets_the_generous_cap() -> None:
    assert verdict(container(UNKNOWN_TIER_CAP_S - 1, tier="gold")) is None
    assert verdict(container(UNKNOWN_TIER_CAP_S + 1, tier="gold")) is ReapReason.EXPIRED


def test_a_tiers_own_max_idle_age_applies() -> None:
    assert verdict(container(1 + 1 + 5 + 0.5, tier="sweep")) is ReapReason.EXPIRED


def _reaped(reason: str) -> float:
    return REGISTRY.get_sample_value("reactq_sandbox_reaped_total", {"reason": reason}) or 0.0


@pytest.mark.docker
def test_leaked_containers_are_swept_and_counted(sandbox_image: str, docker_engine, tmp_path: Path) -> None:
    tiers_file = tmp_path / "tiers.toml"
    tiers_file.write_text(TEST_TIERS + SWEEP_TIER, encoding="utf-8")
    # The background sweep is slowed down so this test drives every round itself.
    settings = SandboxSettings(sandbox_tiers_file=tiers_file, sandbox_pool_tiers="tiny",
                               sandbox_sweep_interval_s=3600, sandbox_sweep_grace_s=1)
    mark = uuid.uuid4().hex
    labels = {"reactq.sandbox": "1", "reactq.sandbox.tier": "sweep", "test.mark": mark}
    dead_owner = f"{socket.gethostname()}/{2**22 + os.getpid() % 1000}/0"
    before = {reason: _reaped(reason) for reason in ("expired", "leftover", "orphan")}
    sleeper = ["python3", "-c", "import time; time.sleep(600)"]
    with SandboxService(settings, backend="docker") as svc:
        assert svc.pool is not None and svc.pool.wait_ready(60) and svc.sweeper is not None
        warm = {sb.container_id for sb in svc.pool._ready["tiny"]}
        leaked = docker_engine.containers.run(sandbox_image, sleeper, detach=True, labels=labels,
                                              network_disabled=True, user="65534:65534")
        never_started = docker_engine.containers.create(sandbox_image, sleeper, labels=labels,
                                                        network_disabled=True)
        orphan = docker_engine.containers.run(
            sandbox_image, sleeper, detach=True, network_disabled=True, user="65534:65534",
            labels={**labels, "reactq.sandbox.tier": "tiny", "reactq.sandbox.owner": dead_owner})
        ids = {leaked.id, never_started.id, orphan.id}
        reaped: dict[str, ReapReason] = {}

        def sweep() -> dict[str, ReapReason]:
            reaped.update((cid, reason) for cid, reason in svc.sweeper.run_once() if cid in ids)
            return reaped

        wait_for("the three planted containers to be swept", sweep, 60, 0.5, until=lambda swept: set(swept) == ids,
                 show=lambda swept: f"never swept: {ids - set(swept)}")
        assert reaped == {leaked.id: ReapReason.EXPIRED, never_started.id: ReapReason.LEFTOVER,
                          orphan.id: ReapReason.ORPHAN}, f"never swept: {ids - set(reaped)}"
        left = docker_engine.api.containers(all=True, filters={"label": f"test.mark={mark}"})
        assert left == []
        # The pool's idle warm containers were older than the sweep tier's limits, and are untouched.
        running = {c["Id"] for c in docker_engine.api.containers(filters={"status": "running"})}
        assert warm <= running
    for reason in ("expired", "leftover", "orphan"):
        assert _reaped(reason) >= before[reason] + 1, reason


def test_the_pool_grows_with_the_take_rate_and_is_capped() -> None:
    from tools_sandbox.backends.docker_backend import DockerBackend
    from tools_sandbox.backends.pool import RATE_WINDOW_S, Limits, WarmPool

    tiers = parse_tiers(TEST_TIERS)
    pool = WarmPool(DockerBackend(), tiers, {"tiny": 2}, limits=Limits(max_size=6))  # never started: no engine
    assert pool.target("tiny", now=NOW) == 2 and pool.target("roomy", now=NOW) == 0
    pool._build_s = 0.3
    pool._takes["tiny"].extend(sorted(NOW - i * RATE_WINDOW_S / 100 for i in range(100)))  # 10 takes/s
    assert pool.target("tiny", now=NOW) == 5  # ceil(10/s x 0.3 s x 1.5)
    pool._takes["tiny"].extend([NOW] * 400)
    assert pool.target("tiny", now=NOW) == 6  # the cap
    assert pool.target("tiny", now=NOW + 2 * RATE_WINDOW_S) == 2  # traffic stopped: back to the base
