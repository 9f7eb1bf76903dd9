"""`reactq api` as a process on the test cluster's Redis, and an HTTP client for it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures_cluster import ROOT, Cluster
from tests.fixtures_services import free_port, wait_for_port


@pytest.fixture
def api_client(cluster: Cluster) -> Iterator[httpx.Client]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "api", "--port", str(port)], env=cluster.env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(10)
