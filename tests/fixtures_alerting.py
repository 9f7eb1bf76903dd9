"""Real alerting parts for tests, each a process on a loopback port, stopped when its `with` block ends:

- `acl_redis(tmp, binary=...)`: redis-server started by deploy/redis/start.sh with deploy/redis/acl.conf (or
  another ACL text), the production limits (2 GB, noeviction, 10000 clients) unless overridden;
- `redis_exporter(addr, user, password)`: Debian's prometheus-redis-exporter, configured by environment
  (REDIS_ADDR, REDIS_USER, REDIS_PASSWORD) as docker-compose.yml and deploy/k8s/base/redis-exporter.yaml do;
- `alertmanager(config)`: Debian's prometheus-alertmanager with that configuration, clustering off;
- `prometheus(config)`: Prometheus with that configuration (the `start_prometheus` fixture sets none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_cluster import ROOT
from tests.fixtures_prometheus import Prometheus, Samples, prometheus_binary, scrape, stop_group
from tests.fixtures_services import free_port, wait_for_port
from tests.waiting import wait_for

REDIS_DIR = ROOT / "deploy" / "redis"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
PASSWORDS = {"REDIS_API_PASSWORD": "pw-api", "REDIS_STEP_WORKER_PASSWORD": "pw-step-worker",
             "REDIS_SANDBOX_WORKER_PASSWORD": "pw-sandbox-worker", "REDIS_EXPORTER_PASSWORD": "pw-exporter",
             "REDIS_KEDA_PASSWORD": "pw-keda"}
PRODUCTION_LIMITS = {"maxmemory": "2gb", "maxmemory-policy": "noeviction", "maxclients": "10000"}


def binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (apt-get install {package}; scripts/test.sh does)")
    return found


@dataclass
class AclRedis:
    port: int

    def url(self, user: str) -> str:
        password = PASSWORDS[f"REDIS_{user.upper().replace('-', '_')}_PASSWORD"]
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"


@contextmanager
def acl_redis(workdir: Path, redis_server: str | None = None, acl_text: str | None = None,
              **limits: str) -> Iterator[AclRedis]:
    """redis-server (the one on PATH, or `redis_server`) behind deploy/redis/start.sh and the role users."""
    server = redis_server or binary("redis-server", "redis-server")
    template = REDIS_DIR / "acl.conf"
    if acl_text is not None:
        template = workdir / "acl.conf"
        template.write_text(acl_text)
    port = free_port()
    args = [arg for k, v in {**PRODUCTION_LIMITS, **limits}.items() for arg in (f"--{k}", v)]
    env = {**os.environ, **PASSWORDS, "PATH": f"{Path(server).parent}:{os.environ['PATH']}", "TMPDIR": str(workdir)}
    log = (workdir / "redis.log").open("wb")
    proc = subprocess.Popen(["sh", str(REDIS_DIR / "start.sh"), str(template), "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, timeout=30, owner=proc)
        yield AclRedis(port)
    finally:
        stop_group(proc)


@dataclass
class Exporter:
    address: str  # host:port of its /metrics
    logfile: Path

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def scrape(self) -> Samples:
        return scrape(self.url)

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")


@contextmanager
def redis_exporter(workdir: Path, redis_addr: str, user: str, password: str) -> Iterator[Exporter]:
    """Debian's redis_exporter, with -debug so that its log shows every command Redis refused."""
    port = free_port()
    logfile = workdir / f"redis-exporter-{port}.log"
    env = {**os.environ, "REDIS_ADDR": redis_addr, "REDIS_USER": user, "REDIS_PASSWORD": password}
    proc = subprocess.Popen([binary("prometheus-redis-exporter", "prometheus-redis-exporter"), "-debug",
                             f"-web.listen-address=127.0.0.1:{port}"],
                            env=env, stdout=logfile.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, timeout=30, owner=proc)
        yield Exporter(f"127.0.0.1:{port}", logfile)
    finally:
        stop_group(proc)


@dataclass
class Alertmanager:
    url: str
    logfile: Path


def check_alertmanager_config(path: Path) -> None:
    done = subprocess.run([binary("amtool", "prometheus-alertmanager"), "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@contextmanager
def _serve(what: str, command: list[str], port: int, logfile: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends, once its HTTP server on `port` answers /-/ready with 200."""
    proc = subprocess.Popen(command, stdout=logfile.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, timeout=30, owner=proc)
        wait_for(f"{what} to be ready (log in {logfile})",
                 lambda: httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code, 30, 0.2,
                 until=lambda status: status == 200)
        yield proc
    finally:
        stop_group(proc)


@contextmanager
def alertmanager(workdir: Path, config: dict[str, Any]) -> Iterator[Alertmanager]:
    """prometheus-alertmanager with `config` (checked by amtool first), on a free loopback port."""
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    check_alertmanager_config(path)
    port = free_port()
    logfile = workdir / "alertmanager.log"
    with _serve("Alertmanager", [binary("prometheus-alertmanager", "prometheus-alertmanager"),
                                 f"--config.file={path}", f"--storage.path={workdir / 'alertmanager-data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                port, logfile):
        yield Alertmanager(f"http://127.0.0.1:{port}", logfile)


@contextmanager
def prometheus(workdir: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    """/usr/bin/prometheus with `config` (e.g. tests.fixtures_prometheus.config_for's, plus an alerting block)."""
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    logfile = workdir / "prometheus.log"
    with _serve("Prometheus", [prometheus_binary(), f"--config.file={path}",
                               f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                               "--log.level=warn"], port, logfile) as proc:
        yield Prometheus(f"http://127.0.0.1:{port}", proc, logfile)
