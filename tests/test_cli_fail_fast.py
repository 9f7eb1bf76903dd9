"""People get an answer within seconds when Redis is down; daemons wait through a restart.

The store's client retries for ~30 s (right for a worker riding out a Redis restart). An interactive
command must not inherit that: it says Redis is unreachable, names the URL without its password and
exits 2. Which path a command took is counted, not timed: the "Redis" here accepts each connection and
resets it at once, and the quick path connects exactly once where the patient one reconnects ~50 times.
The subprocess timeout only guards against a hang; it is generous, so a loaded machine cannot fail it."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.errors import StoreUnavailable, redact_url

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 180  # the patient path would take ~55 s here: far below this, and counted anyway


class ClosingListener:
    """A TCP port where no Redis answers: every connection is accepted, counted and reset at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def no_redis() -> Iterator[ClosingListener]:
    listener = ClosingListener()
    yield listener
    listener.close()


def reactq_without_redis(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")}
    env["REACTQ_REDIS_URL"] = url
    return subprocess.run([sys.executable, "-m", "worker.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("args", [
    ["status", "r-1"], ["trace", "r-1"], ["cancel", "r-1"], ["ask", "What is 2+2?"],
    ["batch", "{infile}", "--out", "{outfile}"], ["api", "--port", "0"],
], ids=lambda a: a[0])
def test_interactive_commands_say_redis_is_unreachable_at_once(args: list[str], tmp_path: Path,
                                                              no_redis: ClosingListener) -> None:
    infile = tmp_path / "in.jsonl"
    infile.write_text('{"id": "q1", "question": "What is 2+2?"}\n')
    filled = [a.format(infile=infile, outfile=tmp_path / "out.jsonl") for a in args]
    done = reactq_without_redis(*filled, url=f"redis://127.0.0.1:{no_redis.port}/0")
    assert done.returncode == 2, done.stderr
    assert f"cannot reach Redis at redis://127.0.0.1:{no_redis.port}/0" in done.stderr
    # The patient client would reconnect ~50 times over ~55 s here (a password changes that: its AUTH is
    # not retried, which is why this URL has none).
    assert no_redis.connections == 1


def test_a_refused_connection_is_reported_without_the_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        done = reactq_without_redis("status", "r-1", url=f"redis://:hunter2@127.0.0.1:{port}/0")
    assert done.returncode == 2, done.stderr
    assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


@pytest.mark.parametrize("url, shown", [
    ("redis://:secret@host:6379/0", "redis://host:6379/0"),
    ("redis://user:secret@host:6379", "redis://host:6379"),
    ("rediss://host:6380/1", "rediss://host:6380/1"),
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ("not a url", "not a url"),
])
def test_redis_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert str(StoreUnavailable(url, ConnectionError("refused"))) == f"cannot reach Redis at {shown}: refused"
