"""Sandbox test fixtures (owned by the sandbox work).

Docker tests need a real engine and the sandbox image. Without an engine they skip
on a laptop, but fail when REACTQ_REQUIRE_DOCKER=1 (CI sets it): CI must never
silently skip the attack suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_TIERS = """
[tiers.tiny]
cpus = 0.5
memory_mb = 64
wall_time_s = 2
cpu_time_s = 1
pids = 32
output_bytes = 8192
tmpfs_mb = 8
nofile = 64
pool_size = 2

[tiers.tiny.quota]
concurrent_executions = 2
executions_per_minute = 1000
cpu_seconds_per_day = 1000

[tiers.roomy]
cpus = 1.0
memory_mb = 256
wall_time_s = 10
cpu_time_s = 8
pids = 64
output_bytes = 65536
tmpfs_mb = 32
pool_size = 1

[tiers.roomy.quota]
concurrent_executions = 1
executions_per_minute = 3
cpu_seconds_per_day = 5
"""


RUNTIMES = ("runc", "runsc")
# A small test tier's fields, unless a test says otherwise.
SMALL_TIER = {"cpus": 0.5, "memory_mb": 64, "wall_time_s": 2, "cpu_time_s": 1, "pids": 32, "output_bytes": 8192,
              "tmpfs_mb": 8, "pool_size": 0}


def tier_toml(name: str, quota: tuple[int, int, float], **fields: object) -> str:
    """One `[tiers.<name>]` table and its quota (concurrent, per minute, CPU seconds per day), as TOML."""
    body = "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in {**SMALL_TIER, **fields}.items())
    concurrent, per_minute, cpu_per_day = quota
    return (f"\n[tiers.{name}]\n{body}\n[tiers.{name}.quota]\nconcurrent_executions = {concurrent}\n"
            f"executions_per_minute = {per_minute}\ncpu_seconds_per_day = {cpu_per_day}\n")


def tiers_on(runtime: str, text: str = TEST_TIERS) -> str:
    """The tiers file `text` with every tier requiring `runtime` (runc is the engine's default)."""
    from tools_sandbox.base.tiers import requiring_runtime

    return requiring_runtime(text, runtime)


def require_runtime(engine: object, runtime: str) -> None:
    """Skip on a laptop, fail under REACTQ_REQUIRE_DOCKER=1, when the engine lacks `runtime`
    (scripts/start-dockerd.sh registers Debian's runsc)."""
    have = set((engine.info().get("Runtimes") or {}).keys())  # type: ignore[attr-defined]
    if runtime not in have:
        msg = f"the Docker engine has no {runtime} runtime (it has {sorted(have)}); run scripts/start-dockerd.sh"
        if _require_docker():
            pytest.fail(f"REACTQ_REQUIRE_DOCKER=1 but {msg}")
        pytest.skip(msg)


def _require_docker() -> bool:
    return os.environ.get("REACTQ_REQUIRE_DOCKER", "") == "1"


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[object]:
    """A docker SDK client to a live engine (skip, or fail when REACTQ_REQUIRE_DOCKER=1)."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        msg = f"no Docker engine answers ({exc}); run scripts/start-dockerd.sh"
        if _require_docker():
            pytest.fail(f"REACTQ_REQUIRE_DOCKER=1 but {msg}")
        pytest.skip(msg)
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_engine: object) -> str:
    """The sandbox image, built offline once (reused when present)."""
    from tools_sandbox.backends.image import build_image
    from tools_sandbox.base.config import SandboxSettings

    tag = SandboxSettings().sandbox_image
    build_image(docker_engine, tag, log=lambda _msg: None)  # type: ignore[arg-type]
    return tag


@pytest.fixture(scope="session")
def test_tiers_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small, fast tiers for tests: `tiny` (2 s wall, 64 MB) and `roomy` (tight quotas)."""
    path = tmp_path_factory.mktemp("tiers") / "tiers.toml"
    path.write_text(TEST_TIERS, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def sandbox_settings(test_tiers_file: Path) -> object:
    from tools_sandbox.base.config import SandboxSettings

    return SandboxSettings(sandbox_tiers_file=test_tiers_file)


@pytest.fixture
def docker_backend(sandbox_image: str) -> Iterator[object]:
    """A started DockerBackend (no pool); closing waits for its removals."""
    from tools_sandbox.backends.docker_backend import DockerBackend

    backend = DockerBackend(sandbox_image)
    backend.start()
    yield backend
    backend.close()


def labelled_containers(client: object, *, mine: bool = False) -> list[dict]:
    """Every container carrying the sandbox label on the test engine, or (`mine`) only those this test
    process started: other engineers' tests share the engine, and their containers are none of ours."""
    from tools_sandbox.backends.docker_backend import LABEL_OWNER
    from tools_sandbox.backends.owners import owner_id

    label = f"{LABEL_OWNER}={owner_id()}" if mine else "reactq.sandbox=1"
    return client.api.containers(all=True, filters={"label": label})  # type: ignore[attr-defined]


def pool_executing(client: object, pool: object, timeout: float = 60) -> list[str]:
    """Once one is, the ids of this test process's containers that the warm pool `pool` is executing a call in
    (waits for it)."""
    from tests.waiting import wait_for

    def executing() -> list[str]:
        return [c["Id"] for c in labelled_containers(client, mine=True)
                if pool.backend.executing_since(c["Id"]) is not None]  # type: ignore[attr-defined]

    return wait_for("a call's container to be executing", executing, timeout, 0.02)


def worker_containers(client: object, pid: int, *, running: bool = False) -> list[dict]:
    """The sandbox containers that the worker process `pid` started (owner label host/pid/start-time), or
    (`running`) only those still running. The low-level listing: the SDK's containers.list() inspects each
    container, and on the shared engine one can vanish in between (a 404)."""
    from tools_sandbox.backends.docker_backend import LABEL, LABEL_OWNER

    filters = {"label": f"{LABEL}=1", **({"status": "running"} if running else {})}
    listed = client.api.containers(all=True, filters=filters)  # type: ignore[attr-defined]
    return [c for c in listed if (c.get("Labels") or {}).get(LABEL_OWNER, "").split("/")[1:2] == [str(pid)]]


def executing_containers(client: object, pid: int) -> list[str]:
    """The ids of the worker process `pid`'s containers that are running a program (a warm container
    runs only tini, the supervisor, its spawner, and the execution child and cleaner waiting for the
    request, each naming itself; anything else is a program, named exec-program, or its children).
    Asked inside the container: under gVisor the engine's `top` lists host processes, not the sandbox's."""
    idle = {"tini", "python3", "spawner", "exec-waiting", "cleaner"}
    look = ["sh", "-c", "cat /proc/[0-9]*/comm"]  # this look's own processes are named sh and cat

    def busy(container_id: str) -> bool:
        api = client.api  # type: ignore[attr-defined]
        try:
            exec_id = api.exec_create(container_id, look, stderr=False)["Id"]
            names = set(api.exec_start(exec_id).decode(errors="replace").split())
        except Exception:  # noqa: BLE001 - gone between the listing and the look
            return False
        return bool(names - idle - {"sh", "cat"})

    return [c["Id"] for c in worker_containers(client, pid, running=True) if busy(c["Id"])]


def start_backendless_worker(cluster: object, metrics_port: int = 0, **extra_env: str) -> object:
    """A `reactq worker --queues sandbox` whose backend cannot start (the test's environment sees to that):
    it neither consumes nor heartbeats the sandbox queue, so Cluster.start_worker would wait for it in vain;
    ready once it has said in its log that it takes no sandbox tasks. Stopped with the cluster."""
    import subprocess
    import sys

    from tests.fixtures_cluster import ROOT
    from tests.waiting import wait_for

    procs = cluster.procs  # type: ignore[attr-defined]
    path = cluster.logdir / f"worker-{len(procs)}.log"  # type: ignore[attr-defined]
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", "--queues", "sandbox", "--concurrency", "2",
         "--metrics-port", str(metrics_port)],
        env={**cluster.env, **extra_env}, stdout=path.open("wb"), stderr=subprocess.STDOUT,  # type: ignore[attr-defined]
        cwd=ROOT, start_new_session=True,
    )
    procs.append(proc)

    def said_so() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}; its log:\n{path.read_text(errors='replace')}")
        return "takes no sandbox tasks until it starts" in path.read_text(errors="replace")

    wait_for(f"the backendless worker to say so (log {path})", said_so, 90)
    return proc
