"""The best-effort answer at a limit end to end: a real worker, the api_stub, `reactq api` and a webhook
receiver on loopback. `partial: true` shows in the API's run view and in the run's webhook."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.fixtures_cluster import Cluster
from tests.fixtures_receiver import Receiver
from tests.waiting import wait_for


@pytest.mark.integration
def test_a_capped_run_is_partial_in_the_api_and_its_webhook(
        cluster: Cluster, make_receiver: Callable[[int], Receiver], api_client: httpx.Client) -> None:
    receiver = make_receiver(0)
    cluster.env.update({"REACTQ_WEBHOOK_ALLOW_PRIVATE": "1"})
    cluster.start_worker(queues="steps,sandbox")
    created = api_client.post("/v1/runs", json={"question": "What is 3 * 4?", "max_steps": 1,
                                                "webhook_url": receiver.url})
    assert created.status_code in (200, 201, 202), created.text
    run_id = created.json()["run_id"]
    [call] = receiver.wait_for("the run's webhook", lambda c: len(c) >= 1)
    body = json.loads(call.body)
    assert body["status"] == "max_steps" and body["partial"] is True and body["answer"], body
    view = wait_for("the finished run", lambda: api_client.get(f"/v1/runs/{run_id}", params={"trace": "true"}).json(),
                    60, until=lambda v: v["status"] == "max_steps")
    assert view["partial"] is True and view["answer"] == body["answer"]
    assert [s["best_effort"] for s in view["trace"]] == [False, True]
