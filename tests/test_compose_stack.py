"""The compose stack, brought up and scaled: docker-compose.yml + deploy/compose.test.yml on the host engine.

Images are built offline (scripts/build_stack_images.py: debootstrap + `docker import`, then local
builds; reused while their inputs are unchanged). The stack runs Redis (AOF, one ACL user per role, passwords
written by scripts/compose-secrets.sh), the API, the stub, two step workers, a sandbox worker and
Prometheus. A tenant and its API key are made with the CLI inside the stack (`docker-compose run api
tenant add` / `key create`, before the API starts: it refuses to without one), and a 200-question batch
goes in over HTTP with that key; in
the middle of it the step workers are scaled to 4 and one of them is SIGKILLed. Every run must be
answered right, and Prometheus's `up` must show every step-worker replica.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures_cluster import ROOT
from tests.fixtures_services import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.integration]

SERVICES = ["redis", "stub", "step-worker", "sandbox-worker-host", "prometheus"]  # then the API, once keyed
TENANT = "compose-test"
SAMPLE = ROOT / "worker" / "data" / "sample_batch.jsonl"
BATCH_SIZE = 200


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    api: str
    prometheus: str
    headers: dict[str, str]

    def compose(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(
            ["docker-compose", "-p", self.project, "-f", str(ROOT / "docker-compose.yml"),
             "-f", str(ROOT / "deploy" / "compose.test.yml"), *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc.stdout

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()


def wait_until(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0, **options: Any) -> Any:
    """tests.waiting.wait_for, once a second, through the moments a service of the stack does not answer."""
    return wait_for(what, check, timeout, every, ignoring=(httpx.HTTPError, OSError), **options)


def stack_images_and_secrets(work: Path) -> dict[str, str]:
    """The stack's offline images built (scripts/build_stack_images.py) and the role passwords made as an
    operator makes them (scripts/compose-secrets.sh): this process's environment without REACTQ_/DOCKER_
    variables, plus the image tags and the passwords, for docker-compose."""
    build = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_stack_images.py"), "--env-file",
                            str(work / "images.env")], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, f"building the stack images failed:\n{build.stderr[-4000:]}"
    secrets = work / "secrets.env"
    made = subprocess.run(["bash", str(ROOT / "scripts" / "compose-secrets.sh"), str(secrets)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACTQ_", "DOCKER_"))}
    for path in (work / "images.env", secrets):
        env.update(line.partition("=")[::2] for line in path.read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    return env


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def _prometheus_config(target_dir: Path) -> None:
    """The shipped config with its job names and rules, scraping and re-resolving every 2 s."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="2s", scrape_timeout="2s", evaluation_interval="2s")
    config["rule_files"] = [f"/etc/prometheus/{name}" for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            sd["refresh_interval"] = "2s"
    (target_dir / "prometheus.yml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def stack(docker_engine: object, sandbox_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed (apt-get install docker-compose); scripts/test.sh installs it")
    work = tmp_path_factory.mktemp("compose")
    env = stack_images_and_secrets(work)
    prom_dir = work / "prometheus"
    prom_dir.mkdir()
    _prometheus_config(prom_dir)
    api_port, prom_port = free_port(), free_port()
    env.update(REACTQ_TEST_PROMETHEUS_DIR=str(prom_dir), REACTQ_API_PORT=str(api_port),
               REACTQ_PROMETHEUS_PORT=str(prom_port))
    s = Stack(project=f"reactqtest{os.getpid()}", env=env, api=f"http://127.0.0.1:{api_port}",
              prometheus=f"http://127.0.0.1:{prom_port}", headers={})
    try:
        s.compose("up", "-d", "--no-build", *SERVICES)
        # The first tenant and its key, with the CLI in the API's image, as its Redis user (docker-compose.yml)
        s.compose("run", "--rm", "-T", "api", "tenant", "add", TENANT, "--plan", "pro")
        created = s.compose("run", "--rm", "-T", "api", "key", "create", TENANT, "--json")
        s.headers = {"Authorization": "Bearer " + json.loads(created.strip().splitlines()[-1])["key"]}
        s.compose("up", "-d", "--no-build", "api")
        wait_until("the API's /healthz", lambda: httpx.get(f"{s.api}/healthz", timeout=5).status_code == 200, 120)
        assert httpx.get(f"{s.api}/v1/runs", timeout=10).status_code == 401  # no key, no runs
        yield s
    finally:
        sandbox_hosts = {c[:12] for c in s.containers("sandbox-worker-host")} if _compose_ok(s) else set()
        try:
            s.compose("logs", "--no-color", "--tail", "40", timeout=60)
        except AssertionError:
            pass
        s.compose("down", "-v", "--remove-orphans", "-t", "30", timeout=300)
        _remove_sandboxes_of(sandbox_hosts)


def _compose_ok(s: Stack) -> bool:
    try:
        s.compose("ps", "-q", timeout=60)
    except AssertionError:
        return False
    return True


def _remove_sandboxes_of(hosts: set[str]) -> None:
    """Sandbox containers our sandbox worker started on the host engine (labelled with its hostname)."""
    if not hosts:
        return
    for line in _docker("ps", "-a", "--filter", "label=reactq.sandbox=1", "--format",
                        '{{.ID}} {{.Label "reactq.sandbox.owner"}}').splitlines():
        cid, _, owner = line.partition(" ")
        if owner.split("/")[0] in hosts:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


def _questions() -> list[dict[str, str]]:
    sample = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    return [dict(sample[i % len(sample)], id=f"c{i:03d}-{sample[i % len(sample)]['id']}") for i in range(BATCH_SIZE)]


def _batch(s: Stack, batch_id: str) -> dict[str, Any]:
    return httpx.get(f"{s.api}/v1/batches/{batch_id}", headers=s.headers, timeout=10).raise_for_status().json()


def _prom_up(s: Stack, job: str) -> dict[str, float]:
    r = httpx.get(f"{s.prometheus}/api/v1/query", params={"query": f'up{{job="{job}"}}'}, timeout=10)
    return {m["metric"]["instance"]: float(m["value"][1]) for m in r.raise_for_status().json()["data"]["result"]}


def _ips(container_ids: list[str]) -> set[str]:
    out = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", *container_ids)
    return set(out.split())


def test_batch_survives_scale_out_and_a_killed_step_worker(stack: Stack) -> None:
    questions = _questions()
    # The pro tier: ~60 python runs in a minute stay inside its quotas, and its wall time leaves room for a
    # CI machine that is busy with the whole stack.
    body = {"tier": "pro", "runs": [{"question": q["question"], "id": q["id"]} for q in questions]}
    created = httpx.post(f"{stack.api}/v1/batches", json=body, headers=stack.headers, timeout=60)
    assert created.status_code == 201, created.text
    batch_id = created.json()["batch_id"]
    run_ids: list[str] = created.json()["run_ids"]
    assert len(run_ids) == BATCH_SIZE
    assert len(stack.containers("step-worker")) == 2  # deploy.replicas of the production file

    wait_until("30 finished runs", lambda: _batch(stack, batch_id)["finished"], 300, until=lambda done: done >= 30)
    stack.compose("up", "-d", "--no-build", "--no-recreate", "--scale", "step-worker=4", "step-worker")
    workers = stack.containers("step-worker")
    assert len(workers) == 4

    wait_until("90 finished runs", lambda: _batch(stack, batch_id)["finished"], 300, until=lambda done: done >= 90)
    victim = workers[-1]
    _docker("kill", "--signal", "KILL", victim)
    at_kill = _batch(stack, batch_id)
    assert at_kill["finished"] < BATCH_SIZE, "the batch finished before a step worker could be killed mid-way"

    done = wait_until("all 200 runs finished", lambda: _batch(stack, batch_id), 420, every=2,
                      until=lambda batch: batch["finished"] >= BATCH_SIZE)
    assert done["statuses"] == {"succeeded": BATCH_SIZE}, done["statuses"]
    wrong = []
    for q, run_id in zip(questions, run_ids, strict=True):
        run = httpx.get(f"{stack.api}/v1/runs/{run_id}", headers=stack.headers, timeout=10).raise_for_status().json()
        if q["expected"].lower() not in (run.get("answer") or "").lower():
            wrong.append((q["id"], q["expected"], run.get("answer")))
    assert not wrong, f"{len(wrong)} runs answered wrong: {wrong[:5]}"

    # The operator brings the killed replica back; Prometheus then finds all four and each one is up.
    stack.compose("up", "-d", "--no-build", "--no-recreate", "--scale", "step-worker=4", "step-worker")
    seen: dict[str, Any] = {}

    def all_replicas_up() -> bool:
        seen["replicas"] = {f"{ip}:9808" for ip in _ips(stack.containers("step-worker")) if ip}
        seen["up"] = _prom_up(stack, "reactq-step-worker")
        return len(seen["replicas"]) == 4 and set(seen["up"]) == seen["replicas"] and all(
            v == 1 for v in seen["up"].values())

    try:
        wait_until("Prometheus up == 1 for all 4 step-worker replicas", all_replicas_up, 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; replicas {seen.get('replicas')}, up {seen.get('up')}") from None
    assert list(_prom_up(stack, "reactq-sandbox-worker").values()) == [1.0]
    assert list(_prom_up(stack, "reactq-api").values()) == [1.0]
