"""Orphan reaping, the warm pool's replacement policy, and the Celery task."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import redis
from celery import Celery

from tests.fixtures_sandbox import labelled_containers
from tests.waiting import wait_for
from tools_sandbox import SandboxResult, SandboxService, load_tiers
from tools_sandbox.backends.pool import WarmPool
from tools_sandbox.base.render import UNAVAILABLE_TEXT
from tools_sandbox.edges import sandbox_worker


@pytest.mark.docker
def test_orphans_of_a_dead_worker_are_reaped(sandbox_image, docker_engine, test_tiers_file) -> None:
    # A "worker" starts a sandbox and is SIGKILLed mid-execution: its container stays behind.
    script = textwrap.dedent(f"""
        import os, signal
        from tools_sandbox.backends.docker_backend import DockerBackend
        from tools_sandbox.base.tiers import load_tiers
        b = DockerBackend({sandbox_image!r}); b.start()
        sb = b.create_sandbox(load_tiers({str(test_tiers_file)!r})["tiny"])
        sb.raw.sendall(b"")
        print(sb.container_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    orphan = proc.stdout.strip()
    assert orphan, proc.stderr
    assert orphan in [c["Id"] for c in labelled_containers(docker_engine)]

    from tools_sandbox.backends.docker_backend import DockerBackend

    backend = DockerBackend(sandbox_image)
    backend.start()
    tiers = load_tiers(test_tiers_file)
    pool = WarmPool(backend, tiers, {"tiny": 1})
    try:
        pool.start()
        assert orphan in pool.reaped
        assert pool.wait_ready(60)
        assert orphan not in [c["Id"] for c in labelled_containers(docker_engine)]
        ours = [c["Id"] for c in labelled_containers(docker_engine, mine=True)]
        assert len(ours) == 1  # only our live, warm sandbox
        # A live worker's sandboxes are not reaped by a sibling.
        assert ours[0] not in backend.reap_orphans()
    finally:
        pool.close()
        backend.close()
    assert labelled_containers(docker_engine, mine=True) == []


@pytest.mark.docker
def test_the_pool_reuses_a_container_for_its_tenant_only(sandbox_image, sandbox_settings, docker_engine) -> None:
    hostname = "import socket\nprint(socket.gethostname())"
    with SandboxService(sandbox_settings, backend="docker") as service:
        assert service.pool.wait_ready(60)
        first = [service.execute(hostname, tier="tiny", tenant="t1").stdout for _ in range(3)]
        other = service.execute(hostname, tier="tiny", tenant="t2").stdout
        assert len(set(first)) == 1 and first[0].startswith("sandbox-"), first  # one container, three runs
        assert other != first[0]
        # each back in the pool once its supervisor's cleanup is read (after the call returned)
        wait_for("both tenants' containers idle in the pool", lambda: sorted(service.pool.bindings().values()),
                 10, until=lambda bound: bound == [("t1", "tiny"), ("t2", "tiny")])
    assert labelled_containers(docker_engine, mine=True) == []


@pytest.mark.docker
def test_a_local_engine_is_reached_without_the_environments_proxy_lookups(sandbox_image, docker_engine) -> None:
    import docker

    from tools_sandbox.backends.docker_backend import DockerBackend, _skip_environment_lookups

    backend = DockerBackend(sandbox_image)
    backend.start()  # the engine on its unix socket, as the tests and workers reach it
    try:
        assert backend.api.trust_env is False
        backend.ping()
    finally:
        backend.close()
    remote = docker.APIClient(base_url="tcp://127.0.0.1:2375", version="1.41")  # never contacted
    _skip_environment_lookups(remote)
    assert remote.trust_env is True  # an engine over tcp:// may sit behind the environment's proxy


def _celery_app(redis_url: str) -> Celery:
    app = Celery("sandbox-test", broker=redis_url)
    app.conf.task_always_eager = False
    app.set_current()
    return app


def test_task_stores_result_and_continues(redis_url: str, sandbox_settings, monkeypatch) -> None:
    from tools_sandbox.edges import tasks

    monkeypatch.setenv("REACTQ_REDIS_URL", redis_url)
    monkeypatch.setenv("REACTQ_SANDBOX_BACKEND", "process")
    monkeypatch.setenv("REACTQ_SANDBOX_TIERS_FILE", str(sandbox_settings.sandbox_tiers_file))
    sandbox_worker.stop()
    app = _celery_app(redis_url)
    request = {"code": "print(6*7)", "tier": "tiny", "tenant": "acme", "result_key": "test:result:1",
               "continue_task": "reactq.step", "continue_args": ["run-1", 3],
               "continue_queue": "reactq.test.continue"}
    client = redis.Redis.from_url(redis_url)
    try:
        out = tasks.execute.apply(args=[request]).get()
        assert out == {"result_key": "test:result:1", "outcome": "ok"}
        stored = SandboxResult.model_validate_json(client.get("test:result:1"))
        assert stored.stdout == "42\n" and stored.backend == "process"
        assert 0 < client.ttl("test:result:1") <= 7 * 24 * 3600
        assert client.llen("reactq.test.continue") == 1
        message = json.loads(client.lindex("reactq.test.continue", 0))
        assert message["headers"]["task"] == "reactq.step"

        # Redelivery: no second execution, same stored result, the continuation is sent again.
        request2 = dict(request, code="print('should not run')")
        out = tasks.execute.apply(args=[request2]).get()
        assert out["outcome"] == "redelivered"
        assert SandboxResult.model_validate_json(client.get("test:result:1")).stdout == "42\n"
        assert client.llen("reactq.test.continue") == 2

        # An unknown tier is a visible result, not a lost run.
        out = tasks.execute.apply(args=[dict(request, tier="gold", result_key="test:result:2")]).get()
        bad = SandboxResult.model_validate_json(client.get("test:result:2"))
        assert bad.error and bad.error.startswith("unknown_tier") and "tiny" in bad.error
        assert bad.error_kind == "unknown_tier"

        # Any other continuation is refused (logged), never sent: the result is still stored.
        before = client.llen("reactq.test.continue")
        tasks.execute.apply(args=[dict(request, result_key="test:result:3", continue_task="celery.backend_cleanup")])
        assert SandboxResult.model_validate_json(client.get("test:result:3")).stdout == "42\n"
        assert client.llen("reactq.test.continue") == before
    finally:
        sandbox_worker.stop()
        client.close()
        app.close()


def test_task_with_the_engine_gone_sends_the_call_again(redis_url: str, sandbox_settings, monkeypatch) -> None:
    """No Docker engine: the call is not answered but sent back to the queue for another sandbox worker, the
    service reports its backend down; past the window the result is `unavailable`, in fixed words."""
    from tools_sandbox.edges import health, tasks

    monkeypatch.setenv("REACTQ_REDIS_URL", redis_url)
    monkeypatch.setenv("REACTQ_SANDBOX_BACKEND", "docker")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("REACTQ_SANDBOX_TIERS_FILE", str(sandbox_settings.sandbox_tiers_file))
    sandbox_worker.stop()
    app = _celery_app(redis_url)
    client = redis.Redis.from_url(redis_url)
    request = {"code": "print(1)", "tier": "tiny", "tenant": "acme", "result_key": "test:result:gone",
               "continue_task": "reactq.step", "continue_queue": "reactq.test.continue"}
    try:
        out = tasks.execute.apply(args=[request]).get()
        assert out["outcome"] == "unavailable_retry"
        assert not health.backend_up() and sandbox_worker.current().service.up is False
        assert client.get("test:result:gone") is None and client.llen("reactq.test.continue") == 0
        [message] = [json.loads(raw) for raw in client.lrange("reactq.sandbox", 0, -1)]
        assert message["headers"]["task"] == "reactq.sandbox.execute"
        out = tasks.execute.apply(args=[dict(request, unavailable_since=time.time() - 301)]).get()
        assert out["outcome"] == "unavailable"
        stored = SandboxResult.model_validate_json(client.get("test:result:gone"))
        assert stored.error == UNAVAILABLE_TEXT and stored.error_kind == "unavailable"
        assert client.llen("reactq.test.continue") == 1
    finally:
        sandbox_worker.stop()
        client.close()
        app.close()


def test_the_allowed_continuation_is_the_workers_step_task() -> None:
    from tools_sandbox.edges.sandbox_worker import ALLOWED_CONTINUATIONS
    from worker.names import STEP_TASK

    assert frozenset({STEP_TASK}) == ALLOWED_CONTINUATIONS
