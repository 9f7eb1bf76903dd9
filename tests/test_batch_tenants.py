"""One tenant per batch (docs/decisions/batches.md): `reactq batch` refuses a file whose lines name several
tenants, naming them and their lines, before anything is submitted; the batch service refuses such
specs from any caller; and a batch's cancel and DELETE act only on the runs of the batch's tenant (a
batch made before the refusal may list another tenant's runs). Real redis-server, the real CLI and the
real HTTP API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster
from worker.core.models import RunSpec
from worker.errors import InvalidRequest
from worker.runtime.context import Runtime
from worker.service.batch import BatchRunner
from worker.service.batch_input import ParsedLine
from worker.service.submit import new_batch_id, submit

pytestmark = pytest.mark.integration


def _no_send(*args: Any, **kwargs: Any) -> None:
    """No worker here: a run stays queued."""


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_file_naming_several_tenants_is_refused_naming_them_and_their_lines(cluster: Cluster, tmp_path: Path) -> None:
    infile = _write(tmp_path / "in.jsonl", [
        {"id": "a", "question": "What is 1 + 1?"},  # no tenant: --tenant's, else default
        {"id": "b", "question": "What is 2 + 2?", "tenant": "acme"},
        {"id": "c", "question": "What is 3 + 3?", "tenant": "default"},
        *[{"id": f"x{i}", "question": "What is 4 + 4?", "tenant": "acme"} for i in range(7)],
    ])
    out = tmp_path / "out.jsonl"
    refused = cluster.reactq("batch", str(infile), "--out", str(out))
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr
    assert "several tenants" in err, err
    assert "'default' (lines 1, 3)" in err and "'acme' (lines 2, 4, 5, 6, 7 and 3 more)" in err, err
    assert not out.exists()  # nothing was started
    rt = Runtime(cluster.settings())
    assert list(rt.store.sweep.run_ids()) == [] and list(rt.store.sweep.batch_ids()) == []

    # --tenant is the tenant of lines without one: the same file with every line acme's is one batch
    acme_only = _write(tmp_path / "acme.jsonl", [{"id": "a", "question": "What is 1 + 1?"},
                                                 {"id": "b", "question": "What is 2 + 2?", "tenant": "acme"}])
    eval_refused = cluster.reactq("eval", str(infile), "--out", str(tmp_path / "eval.jsonl"))
    assert eval_refused.returncode == 2 and "several tenants" in eval_refused.stderr
    cluster.start_worker(queues="steps", concurrency=4)
    done = cluster.reactq("batch", str(acme_only), "--out", str(out), "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    results = [json.loads(t) for t in out.read_text().splitlines()]
    assert sorted(r["id"] for r in results) == ["a", "b"]
    runs = [rt.store.load_run(r["run_id"]) for r in results]
    assert {run.spec.tenant for run in runs if run} == {"acme"}
    [batch_id] = {run.spec.batch_id for run in runs if run}
    assert rt.store.batches.info(batch_id or "")["tenant"] == "acme"


def test_the_batch_service_refuses_specs_of_two_tenants_from_any_caller(cluster: Cluster, tmp_path: Path) -> None:
    rt = Runtime(cluster.settings())
    runner = BatchRunner(rt.store, rt.settings, _no_send, rt.tenants, rt.budgets)
    lines = [ParsedLine(RunSpec(question="What is 1 + 1?", tenant="default", client_id="one")),
             ParsedLine(RunSpec(question="What is 2 + 2?", tenant="acme", client_id="two"))]
    with pytest.raises(InvalidRequest, match="line 'two' belongs to tenant 'acme' and the batch to tenant 'default'"):
        runner.start(iter(lines), tmp_path / "out.jsonl", lambda error: None)


@pytest.fixture
def mixed_batch(cluster: Cluster) -> tuple[str, list[str], list[str]]:
    """A batch of `default`'s (its owner) that also lists runs of `acme`, as an older reactq made them."""
    rt = Runtime(cluster.settings())
    batch_id = new_batch_id()
    rt.store.batches.create(batch_id, {"tenant": "default", "size": "4"})
    owned = [r.id for r in submit(rt.store, [RunSpec(question=f"What is {i} + 1?", tenant="default")
                                             for i in range(2)], rt.settings, _no_send, batch_id,
                                  tenants=rt.tenants, budgets=rt.budgets)]
    others = [r.id for r in submit(rt.store, [RunSpec(question=f"What is {i} + 2?", tenant="acme")
                                              for i in range(2)], rt.settings, _no_send, batch_id,
                                   tenants=rt.tenants, budgets=rt.budgets)]
    assert rt.store.batches.size(batch_id) == 4
    return batch_id, owned, others


def test_cancel_and_delete_of_a_batch_leave_another_tenants_runs_alone(
    cluster: Cluster, api_server: Callable[..., Api], mixed_batch: tuple[str, list[str], list[str]]
) -> None:
    batch_id, owned, others = mixed_batch
    keys = make_key(cluster, "default"), make_key(cluster, "acme")
    api = api_server()
    owner, other = api.client(keys[0]), api.client(keys[1])
    assert other.post(f"/v1/batches/{batch_id}/cancel").status_code == 404  # not acme's batch

    cancelled = owner.post(f"/v1/batches/{batch_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] == 2, cancelled.text
    assert {owner.get(f"/v1/runs/{r}").json()["status"] for r in owned} == {"cancelled"}
    assert {other.get(f"/v1/runs/{r}").json()["status"] for r in others} == {"queued"}

    deleted = owner.delete(f"/v1/batches/{batch_id}")
    assert deleted.status_code == 200 and deleted.json()["runs"] == 2, deleted.text
    for run_id in owned:
        assert owner.get(f"/v1/runs/{run_id}").status_code == 404
    for run_id in others:  # acme's runs are still acme's, untouched
        assert _status(other, run_id) == "queued"


def test_the_cli_cancel_of_a_batch_acts_on_its_tenants_runs(
    cluster: Cluster, mixed_batch: tuple[str, list[str], list[str]]
) -> None:
    batch_id, owned, others = mixed_batch
    result = cluster.reactq("cancel", "--batch", batch_id, "--json")
    assert json.loads(result.stdout) == {"batch_id": batch_id, "cancelled": 2, "already_finished": 0}
    assert {cluster.run_status(r) for r in owned} == {"cancelled"}
    assert {cluster.run_status(r) for r in others} == {"queued"}


def _status(client: httpx.Client, run_id: str) -> str:
    response = client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    return response.json()["status"]


def test_a_batch_with_failed_runs_exits_non_zero_saying_how_many_and_why(
        cluster: Cluster, stub_control: Any, tmp_path: Path) -> None:
    """`reactq batch` (and `reactq eval`, which shares its exit code) exits 1 when runs failed, with their count
    and reasons: a script or CI job that runs a batch sees it, not just a 0 above a file of errors."""
    stub_control.set_faults(fail_first_n=1, fail_status=400)  # a bad request: no retry helps, the run fails
    infile = _write(tmp_path / "in.jsonl", [{"id": "a", "question": "What is 1 + 1?"}])
    cluster.start_worker(queues="steps", concurrency=4)
    done = cluster.reactq("batch", str(infile), "--out", str(tmp_path / "out.jsonl"))
    err = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, err
    assert "1 run(s) failed:" in err and "1 × LLM call failed" in err and "HTTP 400" in err, err
    [line] = [json.loads(t) for t in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert line["status"] == "failed"

    again = cluster.reactq("batch", str(_write(tmp_path / "ok.jsonl", [{"id": "b", "question": "What is 2 + 2?"}])),
                           "--out", str(tmp_path / "ok-out.jsonl"))
    assert again.returncode == 0, again.stderr  # the fault was spent: this run succeeds
