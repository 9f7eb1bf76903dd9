"""The test harness's wait for a server's port waits for that server, not for whoever holds the port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.fixtures_services import free_port, wait_for_port


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def http_server(port: int, servers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers.append(proc)
    return proc


def test_a_server_refused_its_port_fails_the_wait_though_another_listens_there(
        servers: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    first = http_server(port, servers)
    wait_for_port(port, 30, owner=first)
    second = http_server(port, servers)  # the port is taken: it exits
    with pytest.raises(RuntimeError, match="exited"):
        wait_for_port(port, 30, owner=second)
