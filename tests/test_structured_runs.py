"""Structured final answers through the real path: `reactq worker` processes on a real redis-server, the
real api_stub over HTTP, the real `reactq api` and CLI. A run's `output_schema` comes in by the API body,
a batch line and `reactq ask --output-schema`, in both modes; its `output` is the validated object. A
schema no answer fits ends the run failed with the last validation error; a bad schema is refused at the
door (the pure rules: tests/test_structured_pure.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from markupsafe import escape

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import signed_in
from tests.fixtures_cluster import Cluster
from worker.service.batch_input import iter_input

pytestmark = pytest.mark.integration

SCHEMA = {"type": "object", "properties": {"value": {"type": "number"}, "explanation": {"type": "string"}},
          "required": ["value", "explanation"]}
UNFIT = {"type": "object", "properties": {"value": {"type": "integer", "multipleOf": 7}}, "required": ["value"]}


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_api_batch_line_and_ask_carry_the_validated_object(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                                           tmp_path: Path, mode: str) -> None:
    cluster = tenancy_cluster
    cluster.start_worker(concurrency=8)
    key = make_key(cluster, "default")  # a tenant first: the API will not start without one
    server = api_server()
    api = server.client(key)

    created = api.post("/v1/runs", json={"question": "What is 17 * 23 + 4?", "mode": mode, "output_schema": SCHEMA})
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    cluster.wait_for_run(run_id)
    shown = api.get(f"/v1/runs/{run_id}", params={"trace": "true"}).json()
    assert shown["status"] == "succeeded", shown
    assert shown["output"]["value"] == 395 and isinstance(shown["output"]["explanation"], str)
    assert json.loads(shown["answer"]) == shown["output"]
    assert shown["trace"][-1]["output"] == shown["output"]
    assert shown["trace"][0]["tool_calls"][0]["name"] == "calculator"  # it still used its tools first
    page = signed_in(server, key)[0].get(f"/ui/runs/{run_id}").text  # the UI shows the object and the schema
    assert f'<pre id="output">{escape(json.dumps(shown["output"], indent=2))}</pre>' in page
    assert 'id="output-valid"' in page
    assert f'<pre id="output-schema">{escape(json.dumps(SCHEMA, indent=2))}</pre>' in page

    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    infile.write_text("\n".join(json.dumps(line) for line in (
        {"id": "structured", "question": "What is 2 to the power of 10?", "output_schema": SCHEMA},
        {"id": "plain", "question": "What is 2 to the power of 10?"})) + "\n")
    batch = cluster.reactq("batch", str(infile), "--out", str(out), REACTQ_MODE=mode)
    assert batch.returncode == 0, batch.stderr
    lines = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert lines["structured"]["status"] == "succeeded" and lines["structured"]["output"]["value"] == 1024
    assert lines["plain"]["output"] is None and "1024" in lines["plain"]["answer"]

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    asked = cluster.reactq("ask", "What is (17 + 25) * 3?", "--output-schema", str(schema_file), "--wait", "--json",
                           REACTQ_MODE=mode)
    assert asked.returncode == 0, asked.stderr
    run = json.loads(asked.stdout)
    assert (run["status"], run["mode"], run["output"]["value"]) == ("succeeded", mode, 126)


def test_an_answer_that_never_fits_fails_the_run_with_the_last_validation_error(
        tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    cluster = tenancy_cluster
    cluster.start_worker(concurrency=4, REACTQ_BEST_EFFORT_ANSWER="false")
    key = make_key(cluster, "default")  # a tenant first: the API will not start without one
    api = api_server().client(key)
    created = api.post("/v1/runs", json={"question": "What is 2 + 3?", "output_schema": UNFIT})
    assert created.status_code == 201, created.text
    run = cluster.wait_for_run(created.json()["run_id"])
    assert run["status"] == "failed" and run["output"] is None
    assert run["error"].endswith("last validation error: at $.value: 5 is not a multiple of 7"), run["error"]
    trace = api.get(f"/v1/runs/{run['run_id']}", params={"trace": "true"}).json()["trace"]
    told = [s["error"] for s in trace if s["error"]]
    assert told and "your final answer does not fit the required output schema" in told[0]
    assert trace[-2]["raw_output"] == 'final_answer({"value": 5})'  # the refused call, shown to the model next


def test_a_bad_schema_is_refused_at_every_door(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                               tmp_path: Path) -> None:
    cluster = tenancy_cluster
    key = make_key(cluster, "default")  # a tenant first: the API will not start without one
    api = api_server().client(key)
    remote = {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}
    refused = api.post("/v1/runs", json={"question": "hi", "output_schema": remote})
    assert refused.status_code == 422
    assert "a $ref outside itself" in refused.json()["error"]["message"]
    too_big = api.post("/v1/batches", json={"runs": [
        {"question": "hi"}, {"question": "hi", "output_schema": {"type": "object", "description": "x" * 20_000}}]})
    assert too_big.status_code == 422 and "runs[1]" in too_big.json()["error"]["message"]
    assert "the limit is 16384" in too_big.json()["error"]["message"]

    infile = tmp_path / "in.jsonl"
    infile.write_text("\n".join(json.dumps(line) for line in (
        {"question": "hi", "output_schema": {"type": "array"}},
        {"question": "hi", "output_schema": "not a schema"},
        {"question": "hi", "output_schema": SCHEMA})) + "\n")
    parsed = [str(p) if not hasattr(p, "spec") else p.spec.output_schema
              for p in iter_input(infile, cluster.settings(), None, None)]
    assert parsed[0] == 'line 1: output_schema must describe an object: its root needs "type": "object"'
    assert parsed[1].startswith("line 2: output_schema: ") and parsed[2] == SCHEMA

    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "nonsense"}}}))
    asked = cluster.reactq("ask", "hi", "--output-schema", str(bad_file))
    assert asked.returncode == 2 and "not a valid JSON Schema (at properties/a/type)" in asked.stderr


def test_reactq_eval_scores_structured_answers_field_by_field(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker(concurrency=8)
    dataset = tmp_path / "set.jsonl"
    dataset.write_text("\n".join(json.dumps(line) for line in (
        {"id": "right", "question": "What is 17 * 23 + 4?", "output_schema": SCHEMA, "expected": {"value": 395}},
        {"id": "half", "question": "What is 2 to the power of 10?", "output_schema": SCHEMA,
         "expected": {"value": 1024, "explanation": "two to the tenth"}})) + "\n")
    out = tmp_path / "out.jsonl"
    done = cluster.reactq("eval", str(dataset), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert (lines["right"]["correct"], lines["right"]["field_scores"]) == (True, {"value": 1.0})
    assert lines["half"]["field_scores"] == {"value": 1.0, "explanation": 0.0} and lines["half"]["score"] == 0.5
    assert lines["half"]["correct"] is False and lines["half"]["match"] == "fields"
    assert "field scores" in done.stdout and "explanation" in done.stdout and "50.0%" in done.stdout
