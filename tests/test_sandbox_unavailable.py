"""Infrastructure faults never reach the model: a sandbox call no backend can run is sent again
until REACTQ_SANDBOX_UNAVAILABLE_S, then its run ends `failed` (`sandbox_unavailable`); a sandbox worker
whose backend cannot start takes no sandbox task, says so in its log and in reactq_sandbox_backend_up,
and takes them once its backend is back.

Real step and sandbox workers, the api_stub model, the HTTP API and real Redis; a dead DOCKER_HOST (and,
for the way back, a socket that starts forwarding to the real engine), and a tier the process backend
refuses (it requires gVisor).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.fixtures_cluster import Cluster, metrics_port
from tests.fixtures_prometheus import scrape, total
from tests.fixtures_sandbox import TEST_TIERS, start_backendless_worker, tiers_on
from tests.waiting import wait_for
from tools_sandbox.base.render import UNAVAILABLE_TEXT

pytestmark = pytest.mark.integration

# What an exception's text looks like: none of it may reach an observation, an answer or a run's error.
EXCEPTION_MARKERS = (
    "Error while", "Traceback", "Exception", "(Errno", "Errno ", "ConnectionPool", "Connection aborted",
    "FileNotFoundError", "ConnectionRefused", "Read timed out", "urllib3", "docker.errors", "SandboxUnavailable",
    "TierUnavailable", "RuntimeError", "OSError", "File \"", "No such file",
)
CODE = "print(6 * 7)"
QUESTION = f"Run this python code:\n```python\n{CODE}\n```"
DEAD_DOCKER = "unix:///nonexistent/reactq-test/docker.sock"


def exception_text_in(text: str) -> list[str]:
    return [marker for marker in EXCEPTION_MARKERS if marker in text]


def check_clean_failure(cluster: Cluster, api_client: httpx.Client, run_id: str) -> None:
    """The run ended failed/sandbox_unavailable, and no exception text is in anything stored or shown of it."""
    view = api_client.get(f"/v1/runs/{run_id}", params={"trace": "true"})
    assert view.status_code == 200, view.text
    run = view.json()
    assert run["status"] == "failed" and run["error"].startswith("sandbox_unavailable"), run
    assert run["answer"] is None
    texts = [view.text, run["error"], *(o["content"] for s in run["trace"] for o in s["observations"])]
    cli = cluster.reactq("status", run_id, "--json")
    texts += [cli.stdout, cluster.reactq("trace", run_id, "--json").stdout]
    found = {marker for text in texts for marker in exception_text_in(text)}
    assert not found, (found, texts)


@pytest.fixture
def unavailable_cluster(cluster: Cluster, tmp_path: Path) -> Cluster:
    cluster.env["REACTQ_SANDBOX_UNAVAILABLE_S"] = "6"
    return cluster


def test_no_exception_text_reaches_the_model_the_answer_or_the_run(unavailable_cluster: Cluster,
                                                                  api_client: httpx.Client,
                                                                  tmp_path: Path) -> None:
    """Two ways a call finds no backend, each ending its run failed/sandbox_unavailable in fixed words:
    (1) the only sandbox worker has no Docker engine, so it takes no sandbox task (its call stays queued)
    and the reaper ends the run once no working sandbox worker was seen for the window; (2) a worker that
    takes the call cannot run its tier (the process backend refuses a tier requiring gVisor), sends it
    again with backoff, and stores the `unavailable` result once the window has passed."""
    cluster = unavailable_cluster
    port = metrics_port()
    cluster.start_worker(queues="steps", concurrency=8)
    down = start_backendless_worker(cluster, metrics_port=port, REACTQ_SANDBOX_BACKEND="docker",
                                    DOCKER_HOST=DEAD_DOCKER)
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert total(samples, "reactq_sandbox_backend_up", backend="docker") == 0
    log = cluster.log(down)
    assert "sandbox backend docker is unavailable" in log and "takes no sandbox tasks until it starts" in log

    first = api_client.post("/v1/runs", json={"question": QUESTION})
    assert first.status_code in (200, 201, 202), first.text
    first_id = first.json()["run_id"]
    cluster.wait_for_run(first_id, timeout=120)
    check_clean_failure(cluster, api_client, first_id)
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    assert client.llen("reactq.sandbox") >= 1, "the backendless worker took the call"
    client.close()
    assert "reactq.sandbox.execute[" not in cluster.log(down)  # it never received a sandbox task

    gvisor_only = tmp_path / "gvisor-tiers.toml"
    gvisor_only.write_text(tiers_on("runsc", TEST_TIERS.replace("[tiers.tiny", "[tiers.standard")))
    refusing = cluster.start_worker(queues="sandbox", concurrency=2, REACTQ_SANDBOX_BACKEND="process",
                                    REACTQ_SANDBOX_TIERS_FILE=str(gvisor_only))
    second = api_client.post("/v1/runs", json={"question": QUESTION})
    second_id = second.json()["run_id"]
    cluster.wait_for_run(second_id, timeout=120)
    check_clean_failure(cluster, api_client, second_id)
    # Its step was recorded with the call's fixed-words observation (which no model saw: the run ended there).
    [step] = api_client.get(f"/v1/runs/{second_id}", params={"trace": "true"}).json()["trace"]
    assert [(o["outcome"], o["content"]) for o in step["observations"]] == [("unavailable", UNAVAILABLE_TEXT)]
    assert "found no backend to run it" in cluster.log(refusing)  # it was sent again before giving up


class Forwarder:
    """A unix socket that forwards every connection to the Docker engine's socket, once started: the
    engine "comes back" at a path a worker was told to use."""

    def __init__(self, path: str, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self.server: socket.socket | None = None

    def start(self) -> None:
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.server is not None
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.socket(socket.AF_UNIX)
            far.connect(self.target)
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
def engine_later() -> Iterator[Forwarder]:
    where = tempfile.mkdtemp(prefix="rq-docker-")
    forwarder = Forwarder(os.path.join(where, "docker.sock"))
    yield forwarder
    forwarder.close()
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.docker
def test_a_call_runs_once_the_backend_comes_back_within_the_window(cluster: Cluster, sandbox_image: str,
                                                                   engine_later: Forwarder) -> None:
    """The worker starts with no engine at its DOCKER_HOST: backend_up 0, no sandbox task taken, and a run's
    call waits queued. The engine appears there: the worker's probe finds it, it takes the call, and the run
    succeeds with the program's output."""
    port = metrics_port()
    cluster.env["REACTQ_SANDBOX_UNAVAILABLE_S"] = "600"
    cluster.start_worker(queues="steps", concurrency=8)
    worker = start_backendless_worker(cluster, metrics_port=port, REACTQ_SANDBOX_BACKEND="docker",
                                      REACTQ_SANDBOX_IMAGE=sandbox_image, DOCKER_HOST=f"unix://{engine_later.path}",
                                      REACTQ_SANDBOX_POOL_SIZE="0")
    cluster.graceful.add(worker.pid)  # type: ignore[attr-defined]
    assert total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_sandbox_backend_up", backend="docker") == 0
    asked = cluster.reactq("ask", QUESTION, "--json")
    assert asked.returncode == 0, asked.stderr
    run_id = json.loads(asked.stdout)["run_id"]
    wait_for("the run to wait on its sandbox call", lambda: cluster.load_run(run_id), 60,
             until=lambda run: run is not None and run.waiting_on == "sandbox")
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    assert client.llen("reactq.sandbox") == 1  # queued, not taken
    client.close()

    engine_later.start()
    run = cluster.wait_for_run(run_id, timeout=180)
    assert run["status"] == "succeeded", run
    trace = json.loads(cluster.reactq("trace", run_id, "--json").stdout)["trace"]
    assert trace[0]["observations"][0]["content"] == "42", trace[0]
    assert total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_sandbox_backend_up", backend="docker") == 1
    assert "sandbox backend docker is up" in cluster.log(worker)  # type: ignore[arg-type]
