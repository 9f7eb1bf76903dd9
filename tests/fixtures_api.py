"""The HTTP API as a real process (`reactq api`) on the test's Redis, with tenants and their keys made
in-process by the same `Tenants` store the CLI uses (tests/test_tenancy.py runs the CLI verbs themselves;
a CLI process costs about half a CPU second, and most tests need a key, not the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_services import start_on_free_port
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants

SHIPPED_PLANS = (ROOT / "worker" / "tenancy" / "plans.toml").read_text()
# small limits, so admission is reached with a handful of runs
TINY_PLAN = """
[plans.tiny]
tiers = ["free", "standard"]
tools = ["calculator", "search"]

[plans.tiny.limits]
runs_in_flight = 2
submissions_per_minute = 4
sse_streams = 1
"""


def make_key(cluster: Cluster, tenant: str, plan: str | None = None, via_cli: bool = False) -> str:
    """Add `tenant` (unless `plan` is None: an existing or REACTQ_TENANTS tenant) and create a key for it,
    in-process, or (`via_cli`) with `reactq tenant add` and `reactq key create`."""
    if via_cli:
        if plan is not None:
            added = cluster.reactq("tenant", "add", tenant, "--plan", plan)
            assert added.returncode == 0, added.stderr
        created = cluster.reactq("key", "create", tenant, "--json")
        assert created.returncode == 0, created.stderr
        return json.loads(created.stdout.strip().splitlines()[-1])["key"]
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        tenants = Tenants(TenantStore(client), cluster.settings())
        if plan is not None:
            tenants.add(tenant, plan)
        return tenants.create_key(tenant).key
    finally:
        client.close()


@dataclass
class Api:
    """A running `reactq api` and clients for it."""

    url: str
    proc: subprocess.Popen[bytes]
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.Client(base_url=self.url, timeout=30, headers=headers)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.proc.terminate()
        self.proc.wait(10)


def start_api(cluster: Cluster, *args: str) -> Api:
    def run(port: int) -> subprocess.Popen[bytes]:
        log = (cluster.logdir / f"api-{port}.log").open("wb")
        return subprocess.Popen([sys.executable, "-m", "worker.cli", "api", "--port", str(port), *args],
                                env=cluster.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    try:
        port, proc = start_on_free_port(run, 30)
    except (TimeoutError, RuntimeError) as exc:
        logs = "\n".join(f"{f.name}:\n{f.read_text()}" for f in sorted(cluster.logdir.glob("api-*.log")))
        raise RuntimeError(f"reactq api did not listen ({exc}); the logs:\n{logs}") from None
    return Api(f"http://127.0.0.1:{port}", proc)


@pytest.fixture
def tenancy_cluster(cluster: Cluster, tmp_path: Path) -> Cluster:
    """The cluster with the shipped plans plus `tiny` (REACTQ_PLANS_FILE), for workers and the API alike."""
    plans = tmp_path / "plans.toml"
    plans.write_text(SHIPPED_PLANS + TINY_PLAN)
    cluster.env["REACTQ_PLANS_FILE"] = str(plans)
    return cluster


@pytest.fixture
def api_server(tenancy_cluster: Cluster) -> Iterator[Callable[..., Api]]:
    """Starts `reactq api` (call it once the tenants it needs exist); stopped after the test."""
    started: list[Api] = []

    def start(*args: str) -> Api:
        api = start_api(tenancy_cluster, *args)
        started.append(api)
        return api

    yield start
    for api in started:
        api.stop()


@pytest.fixture
def api_client(cluster: Cluster, api_server: Callable[..., Api]) -> httpx.Client:
    """A client of a running `reactq api` holding a key of the cluster's `default` tenant."""
    key = make_key(cluster, "default")
    return api_server().client(key)
