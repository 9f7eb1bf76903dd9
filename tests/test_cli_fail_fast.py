"""People get an answer within seconds when Redis is down; daemons wait through a restart.

The store's client retries for ~30 s (right for a worker riding out a Redis restart). An interactive
command must not inherit that: it says Redis is unreachable, names the URL without its password and
exits 2. The subprocess timeout below is far above the quick path (one 2 s attempt) and far below the
patient one (~34 s of retries), so taking the wrong path fails the test instead of passing slowly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_services import free_port
from worker.errors import StoreUnavailable, redact_url

ROOT = Path(__file__).resolve().parent.parent
WRONG_PATH_WOULD_TAKE_S = 34


def reactq_without_redis(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")}
    env["REACTQ_REDIS_URL"] = url
    return subprocess.run([sys.executable, "-m", "worker.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=WRONG_PATH_WOULD_TAKE_S / 2)


@pytest.mark.parametrize("args", [
    ["status", "r-1"], ["trace", "r-1"], ["cancel", "r-1"], ["ask", "What is 2+2?"],
    ["batch", "{infile}", "--out", "{outfile}"], ["api", "--port", "0"],
], ids=lambda a: a[0])
def test_interactive_commands_say_redis_is_unreachable_at_once(args: list[str], tmp_path: Path) -> None:
    infile = tmp_path / "in.jsonl"
    infile.write_text('{"id": "q1", "question": "What is 2+2?"}\n')
    filled = [a.format(infile=infile, outfile=tmp_path / "out.jsonl") for a in args]
    port = free_port()  # nothing listens there
    done = reactq_without_redis(*filled, url=f"redis://:hunter2@127.0.0.1:{port}/0")
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
