"""Observability test fixtures: scraping /metrics, a real Prometheus server, the reactq HTTP API process.

- `scrape(url)`: one /metrics page parsed into {(name, labels): value} (prometheus_client.parser).
- `start_prometheus`: a factory that starts /usr/bin/prometheus on a free port with a config generated
  from the shipped deploy/prometheus/prometheus.yml (same job names, same rule files) whose targets are
  the test's processes, scraped and evaluated every second; stopped after the test.
- `start_api`: a factory that starts `reactq api` for a `cluster` and returns its base URL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_services import start_on_free_port
from tests.waiting import wait_for

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of a /metrics page, keyed by (sample name, label set)."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every label set that includes `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls) in samples if n == name]


def prometheus_binary() -> str:
    binary = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if binary is None:
        pytest.fail("prometheus is not installed (apt-get install prometheus); CI installs it")
    return binary


def promtool_binary() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (it comes with the Debian package prometheus)")
    return binary


def config_for(targets: dict[str, list[str]], interval: str = "1s") -> dict[str, Any]:
    """The shipped prometheus.yml with the test's targets per job, 1 s intervals, absolute rule files."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    shipped_jobs = {job["job_name"] for job in config["scrape_configs"]}
    unknown = set(targets) - shipped_jobs
    assert not unknown, f"jobs {unknown} are not in deploy/prometheus/prometheus.yml ({shipped_jobs})"
    config["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)
    config["rule_files"] = [str(PROMETHEUS_DIR / f) for f in config["rule_files"]]
    config["scrape_configs"] = [
        {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
    ]
    return config


@dataclass
class Prometheus:
    """A running Prometheus server with helpers for its HTTP API."""

    url: str
    proc: subprocess.Popen[bytes]
    logfile: Path

    def api(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise PromQLError(path, params, body.get("errorType", ""), body.get("error", response.text))
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now; the result vector (or a one-element list for a scalar)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, predicate: Callable[[float | None], bool], timeout: float = 120) -> float | None:
        return wait_for(f"the value of {expr} the test wants (Prometheus log in {self.logfile})",
                        lambda: self.value(expr), timeout, 0.5, until=predicate)


class PromQLError(Exception):
    def __init__(self, path: str, params: dict[str, str], kind: str, message: str) -> None:
        super().__init__(f"{path} {params}: {kind}: {message}")
        self.kind = kind
        self.message = message


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, list[str]]], Prometheus]]:
    started: list[Prometheus] = []

    def start(targets: dict[str, list[str]]) -> Prometheus:
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(config_for(targets)))
        logfile = workdir / "prometheus.log"
        port, proc = start_on_free_port(lambda port: subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=logfile.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        ), 30)
        server = Prometheus(f"http://127.0.0.1:{port}", proc, logfile)
        started.append(server)
        wait_for(f"Prometheus to be ready (log in {logfile})",
                 lambda: httpx.get(f"{server.url}/-/ready", timeout=5).status_code, 30, 0.2,
                 until=lambda status: status == 200)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGTERM)
            try:
                server.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(server.proc.pid, signal.SIGKILL)
                server.proc.wait(5)


@pytest.fixture
def start_api(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Start `reactq api` on a free port with the cluster's environment; returns its base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**extra_env: str) -> str:
        def run(port: int) -> subprocess.Popen[bytes]:
            log = (cluster.logdir / f"api-{len(procs)}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "api", "--port", str(port)],
                env={**cluster.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                start_new_session=True,
            ))
            return procs[-1]

        port, _ = start_on_free_port(run, 30)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process started in its own session, and its children; SIGKILL after 15 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
