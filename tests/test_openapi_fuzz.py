"""Schemathesis against a real `reactq api` on real Redis: every check (`--checks all`), over the coverage,
fuzzing and stateful phases (the stateful one follows the document's links: a created run is then read,
its event stream followed, cancelled, replayed, deleted ...). It fails on any 5xx, any status or body the
OpenAPI document does not state, any request the document calls valid that the API refuses (and the
reverse), an ignored key, a deleted run still served, and so on. A bounded number of examples keeps it to
one or two minutes; the seed is random, and printed on failure (`--seed N` replays it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster
from worker.api.guards import NOT_BLANK
from worker.api.schemas import DeliveryView, RunView, RunWithTrace
from worker.core.deliveries import Delivery, Event
from worker.core.models import Run, RunSpec
from worker.core.views import run_json

# The settings beyond Schemathesis's defaults, each for a reason no JSON Schema can state:
CONFIG = """
# `--checks all` fails any answer slower than 10 s: on a loaded 2-CPU machine a 6 MB batch body can be.
# Speed is bench/'s (BENCHMARKS.md); here the limit is the request timeout.
[checks]
max_response_time = 30.0

# 413 is a rejection too: a body over REACTQ_MAX_BODY_BYTES is refused before it is parsed, so a batch
# over `maxItems` of long questions answers 413 (documented), not 422. No byte size of a body is
# expressible in JSON Schema.
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]

# The event stream of an unfinished run stays open (keep-alives) until the run ends, and no worker runs
# here: Schemathesis reads a stream for its first two events (`queued`, then `finished` once cancelled)
# or two seconds, then checks the events it got.
[[operations]]
include-operation-id = "run_events"
request-timeout = 2
max-stream-events = 2
"""

EXAMPLES = 25  # per operation and phase: under two minutes on a loaded 2-CPU machine


@pytest.mark.integration
def test_schemathesis_finds_nothing(cluster: Cluster, tmp_path: Path) -> None:
    key = make_key(cluster, "default")
    api = start_api(cluster)
    try:
        document = httpx.get(f"{api.url}/openapi.json").json()
        assert document["components"]["securitySchemes"]["HTTPBearer"] == {
            "type": "http", "scheme": "bearer", "description": "an API key: `reactq key create TENANT`"}
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        done = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
             f"{api.url}/openapi.json", "--checks", "all", "--phases", "coverage,fuzzing,stateful",
             "--header", f"Authorization: Bearer {key}", "--max-examples", str(EXAMPLES),
             "--request-timeout", "30", "--workers", "1",
             "--generation-database", "none", "--no-color", "--output-truncate", "true"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        (tmp_path / "schemathesis.txt").write_text(done.stdout)  # whole, for reading after a failure
        summary = "\n".join(line[:300] for line in done.stdout.splitlines())[-20000:]  # a batch's body is long
        assert done.returncode == 0, summary
        assert "Stateful" in summary and "API Links" in summary, summary
    finally:
        api.stop()


@pytest.mark.integration
def test_the_document_states_every_route_and_its_errors(cluster: Cluster) -> None:
    """Every route but /healthz and /metrics needs the bearer key, and states its error statuses."""
    make_key(cluster, "default")  # `reactq api` starts only once a tenant has a key
    api = start_api(cluster)
    try:
        document = httpx.get(f"{api.url}/openapi.json").json()
    finally:
        api.stop()
    operations = {f"{method.upper()} {path}": op for path, item in document["paths"].items()
                  for method, op in item.items()}
    assert set(operations) >= {  # the routes of docs/DESIGN.md's contract
        "POST /v1/runs", "GET /v1/runs", "GET /v1/runs/{run_id}", "GET /v1/runs/{run_id}/events",
        "POST /v1/runs/{run_id}/cancel", "POST /v1/runs/{run_id}/approvals", "POST /v1/runs/{run_id}/replay",
        "DELETE /v1/runs/{run_id}", "POST /v1/batches", "GET /v1/batches/{batch_id}",
        "POST /v1/batches/{batch_id}/cancel", "DELETE /v1/batches/{batch_id}", "GET /v1/usage",
        "GET /v1/webhooks/deliveries", "GET /healthz", "GET /metrics"}
    for name, op in operations.items():
        public = name in ("GET /healthz", "GET /metrics")
        assert (op.get("security") is None) == public, name
        if not public:
            assert {"401", "403", "503"} <= set(op["responses"]), name
    assert {"400", "404", "409", "413", "422"} <= set(operations["POST /v1/runs/{run_id}/approvals"]["responses"])
    assert "409" in operations["POST /v1/runs/{run_id}/replay"]["responses"]  # from past the recorded steps
    events = operations["GET /v1/runs/{run_id}/events"]
    stream = events["responses"]["200"]["content"]["text/event-stream"]
    assert "schema" not in stream and set(stream["itemSchema"]["properties"]) >= {"id", "event", "data"}
    for status, answer in events["responses"].items():  # its errors are JSON, not events
        assert status == "200" or set(answer["content"]) == {"application/json"}, status
    [last_event_id] = [p for p in events["parameters"] if p["in"] == "header"]
    assert last_event_id["schema"]["type"] == "string" and last_event_id["schema"]["default"] == "0"  # never null
    assert "429" in operations["POST /v1/runs"]["responses"]
    assert operations["POST /v1/runs"]["responses"]["429"]["headers"]["Retry-After"]
    links = operations["POST /v1/runs"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} >= {"get_run", "cancel_run", "delete_run_route"}
    error = document["components"]["schemas"]["ErrorBody"]
    assert error["properties"]["error"] == {"$ref": "#/components/schemas/ErrorDetail"}
    run = document["components"]["schemas"]["RunRequest"]["properties"]
    assert run["question"]["maxLength"] == 8000  # REACTQ_MAX_QUESTION_CHARS's default
    assert run["tier"]["anyOf"][0]["enum"] == ["free", "pro", "standard"]


def test_the_response_models_carry_every_field_the_routes_build() -> None:
    """A field added to a run's JSON or a delivery without its response model would be dropped from
    the answer (FastAPI returns what the model declares): the models must name them all."""
    run = Run(spec=RunSpec(question="q"))
    assert set(run_json(run)) == set(RunView.model_fields)
    assert set(run_json(run, [])) == set(RunWithTrace.model_fields)
    delivery = Delivery(tenant="t", event=Event.RUN_FINISHED, subject_id="r", url="https://example.com/", body="{}")
    assert set(delivery.public()) == set(DeliveryView.model_fields)


def test_the_stated_question_pattern_is_what_submission_checks() -> None:
    """The document's pattern for a question (not blank) holds for a character exactly when `strip()`, as
    the submission's check uses it, keeps it."""
    pattern = re.compile(NOT_BLANK.pattern)
    assert all(bool(pattern.search(c)) == bool(c.strip()) for c in map(chr, range(sys.maxunicode + 1)))


def test_every_path_parameter_states_the_pattern_its_route_checks() -> None:
    """An id the route refuses as malformed (400) must be one the document says is invalid: a route whose
    dependency declared the id as a plain string once left the pattern out (Schemathesis found it by chance)."""
    from worker.api.app import create_app
    from worker.api.guards import ID_PATTERN
    from worker.config import Settings
    from worker.runtime.context import Runtime

    document = create_app(Runtime(Settings())).openapi()
    parameters = [(path, p) for path, operations in document["paths"].items() for op in operations.values()
                  for p in op.get("parameters", []) if p["in"] == "path"]
    assert parameters
    assert [(path, p["name"]) for path, p in parameters if p["schema"].get("pattern") != ID_PATTERN] == []
