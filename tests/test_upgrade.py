"""An upgrade keeps what is already queued: a step message written by a producer that knows only the
wire names (the task and queue names, which are strings in worker/names.py and did not move with the
modules) is run by a worker started the pre-layout way, `celery -A worker.celery_app worker`. And a tenant
recorded before tenants had ids (its data stored under its name) keeps its keys and data: its id is its
name; removed and added again, the new tenant has an id of its own and sees none of it."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable

import redis
from celery import Celery

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import ROOT, Cluster
from worker.config import Settings
from worker.core.models import RunSpec
from worker.service.submit import new_run
from worker.store.connection import connect
from worker.store.runs import RunStore

# As a release before the layout wrote them: literal strings, not imported from worker.names.
OLD_STEP_TASK = "reactq.step"
OLD_STEPS_QUEUE = "reactq.steps"


def test_a_step_queued_by_name_runs_on_a_worker_started_with_celery_dash_a(cluster: Cluster) -> None:
    log = (cluster.logdir / "celery-a.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker", "-Q", OLD_STEPS_QUEUE,
         "-P", "threads", "-c", "4", "--without-mingle", "--without-gossip"],
        env=cluster.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    cluster.procs.append(worker)
    settings = Settings(redis_url=cluster.env["REACTQ_REDIS_URL"])
    store = RunStore(connect(settings.redis_url))
    run = new_run(RunSpec(question="What is 6 * 7?"), settings)
    store.submissions.create_runs([run])

    producer = Celery("pre-upgrade", broker=settings.redis_url)
    producer.send_task(OLD_STEP_TASK, args=[run.id, 0], queue=OLD_STEPS_QUEUE)
    producer.close()

    done = cluster.wait_for_run(run.id)
    assert done["status"] == "succeeded" and "42" in (done["answer"] or ""), done
    assert worker.poll() is None, "the worker exited"


def write_tenant_the_old_way(client: redis.Redis, settings: Settings, name: str) -> tuple[str, str, str]:
    """A tenant, its key, webhook secret, spend and a run as a release before tenant ids wrote them: every
    key named by the tenant's name (literal key names, not worker.store.keys). Returns (key, secret, run id)."""
    key_id = secrets.token_hex(8)
    key = f"rq_{key_id}_{secrets.token_urlsafe(32)}"
    now = str(time.time())
    client.hset(f"reactq:tenant:{name}", mapping={"plan": "standard", "created_at": now})
    client.sadd("reactq:tenants", name)
    client.hset(f"reactq:apikey:{key_id}", mapping={"tenant": name, "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                                    "created_at": now})
    client.sadd(f"reactq:tenant:{name}:keys", key_id)
    client.sadd("reactq:apikeys", key_id)
    secret = secrets.token_hex(32)
    client.hset(f"reactq:tenant:{name}:webhook", "secret", secret)
    client.hset(f"reactq:tenant:{name}:usage", mapping={"prompt_tokens": 120, "completion_tokens": 30})
    run = new_run(RunSpec(question="What is 6 * 7?", tenant=name), settings)
    RunStore(client).submissions.create_runs([run])
    assert client.zscore(f"reactq:tenant:{name}:runs", run.id) is not None
    return key, secret, run.id


def test_a_tenant_recorded_by_name_keeps_its_data_and_a_new_one_of_its_name_sees_none(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    c = tenancy_cluster
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    key, secret, run_id = write_tenant_the_old_way(client, c.settings(), "legacy")
    client.close()
    api = api_server()
    old = api.client(key)
    assert [r["run_id"] for r in old.get("/v1/runs").json()["runs"]] == [run_id]
    assert old.get(f"/v1/runs/{run_id}").json()["tenant"] == "legacy"
    assert old.get("/v1/usage").json()["total"]["prompt_tokens"] == 120
    assert c.reactq("webhook", "secret", "legacy").stdout.strip() == secret
    listed = json.loads(c.reactq("tenant", "list", "--json").stdout)
    assert {"tenant": "legacy", "id": "legacy", "plan": "standard", "overrides": {}, "keys": 1} in listed

    assert c.reactq("tenant", "remove", "legacy").returncode == 0
    assert old.get("/v1/runs").status_code == 403
    new = api.client(make_key(c, "legacy", "standard", via_cli=True))
    assert new.get("/v1/runs").json() == {"runs": [], "next_cursor": None}
    assert new.get(f"/v1/runs/{run_id}").status_code == 404
    assert new.get("/v1/usage").json()["total"]["prompt_tokens"] == 0
    assert c.reactq("webhook", "secret", "legacy").stdout.strip() != secret
