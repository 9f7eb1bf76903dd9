"""An upgrade keeps what is already queued: a step message written by a producer that knows only the
wire names (the task and queue names, which are strings in worker/names.py and did not move with the
modules) is run by a worker started the pre-layout way, `celery -A worker.celery_app worker`."""

from __future__ import annotations

import subprocess
import sys

from celery import Celery

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
