"""The test harness's wait for a server's port waits for that server, not for whoever holds the port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures_services import PortTaken, free_port, start_on_free_port, wait_for_port


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
    with pytest.raises(PortTaken):
        wait_for_port(port, 30, owner=second)


def test_a_server_whose_free_port_was_taken_is_started_again_on_another(
        servers: list[subprocess.Popen[bytes]]) -> None:
    tried: list[int] = []

    def start(port: int) -> subprocess.Popen[bytes]:
        if not tried:  # another test's server takes the port first
            wait_for_port(port, 30, owner=http_server(port, servers))
        tried.append(port)
        return http_server(port, servers)

    port, proc = start_on_free_port(start, 30)
    assert len(tried) == 2 and port == tried[1] != tried[0]
    assert proc is servers[-1] and proc.poll() is None
    assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
