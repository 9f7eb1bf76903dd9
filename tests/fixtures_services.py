"""Real services for integration tests: a redis-server on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from tests.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout: float = 60.0, *, owner: subprocess.Popen[Any]) -> None:
    """Until `owner` (or a child of it) listens on the port. A free port found earlier may be taken by another
    test's server before `owner` binds it: waiting for any listener, the test would talk to that server while
    `owner`, refused the port, exits (a 404 from the wrong server, in one CI run)."""
    wait_for(f"process {owner.pid} ({owner.args!r:.200}) to listen on 127.0.0.1:{port}",
             lambda: owner_listens(owner, port), timeout, 0.05)


class PortTaken(RuntimeError):
    """A server exited before listening on its port, which another process holds."""


def start_on_free_port(start: Callable[[int], subprocess.Popen[Any]], timeout: float = 60.0, attempts: int = 3,
                       first: int | None = None) -> tuple[int, subprocess.Popen[Any]]:
    """`start(port)` on a free port (`first`, if given, for the first try) until the server listens there; on
    another port when the one found free was taken before the server could bind it. Returns the port and the
    server."""
    for attempt in range(1, attempts + 1):
        port = first if attempt == 1 and first is not None else free_port()
        proc = start(port)
        try:
            wait_for_port(port, timeout, owner=proc)
            return port, proc
        except PortTaken:
            if attempt == attempts:
                raise
        except BaseException:  # it did not listen in time: no server is left behind
            proc.kill()
            proc.wait()
            raise
    raise AssertionError("no attempt made")


def owner_listens(owner: subprocess.Popen[Any], port: int) -> bool:
    """Whether `owner` or one of its children listens on TCP `port`; raises once `owner` has exited."""
    if owner.poll() is not None:
        if listening(port):
            raise PortTaken(f"process {owner.pid} exited ({owner.returncode}): another process holds port {port}")
        raise RuntimeError(f"process {owner.pid} exited ({owner.returncode}) before listening on port {port}")
    try:
        root = psutil.Process(owner.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in proc.net_connections(kind="tcp")):
                return True
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:  # another user's process we may not inspect: any listener will do
            return listening(port)
    return False


class RedisServer:
    """A real redis-server process (AOF on, noeviction), restartable on the same port and data dir."""

    def __init__(self, workdir: Path, port: int | None = None, password: str | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.port_chosen = port is None  # its first start moves to another port if another process took this one
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (apt-get install redis-server)")

        def run(port: int) -> subprocess.Popen[bytes]:
            self.proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                 "--maxmemory-policy", "noeviction", "--maxclients", "10000",
                 *(["--requirepass", self.password] if self.password else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            return self.proc

        if self.port_chosen:
            self.port, _ = start_on_free_port(run, first=self.port)
            self.port_chosen = False  # restarts keep the port its clients know
        else:
            wait_for_port(self.port, owner=run(self.port))
        client = redis.Redis.from_url(self.url)
        wait_for(f"redis-server on port {self.port} to load its data and answer PING", client.ping, 60, 0.05,
                 ignoring=(redis.exceptions.BusyLoadingError,))
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's redis-server."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which the test may stop and start again (same port, same data)."""
    server = RedisServer(tmp_path / "redis-data")
    server.workdir.mkdir()
    server.start()
    yield server
    server.stop()
