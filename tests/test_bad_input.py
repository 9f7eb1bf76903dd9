"""Bad input answers 422 naming what was wrong and where, over HTTP against a real `reactq api`: lone
surrogates, non-finite numbers, a malformed page cursor, an offset past any batch, a bad Last-Event-ID
(refused before the stream opens). Each of these once answered 500, 503 or dropped the stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api_stub import StubServer
from tests.fixtures_api import make_key, start_api
from tests.fixtures_cluster import Cluster, cluster_environment
from tests.fixtures_services import RedisServer
from worker.service.batch_input import iter_input

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def module_cluster(stub_server: StubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One redis-server and API for the module (every test here only reads or adds its own runs)."""
    redis_server = RedisServer(tmp_path_factory.mktemp("bad-input-redis"))
    redis_server.start()
    try:
        yield Cluster(cluster_environment(redis_server.url, stub_server.base_url), tmp_path_factory.mktemp("bad"))
    finally:
        redis_server.stop()


@pytest.fixture(scope="module")
def api(module_cluster: Cluster) -> Iterator[httpx.Client]:
    """A client acting as tenant `default`; no worker, so runs stay queued."""
    key = make_key(module_cluster, "default")
    server = start_api(module_cluster)
    try:
        yield server.client(key)
    finally:
        server.stop()


def refused(response: httpx.Response, *parts: str) -> str:
    """The 422's message, checked to hold each of `parts`."""
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert response.json()["error"]["status"] == 422
    for part in parts:
        assert part in message, message
    return message


@pytest.mark.parametrize(("body", "where"), [
    (rb'{"question": "\ud800"}', "body.question"),
    (rb'{"question": "hi", "id": "a\udfffb"}', "body.id"),
    (rb'{"question": "hi", "webhook_url": "https://example.com/\ud800"}', "body.webhook_url"),
    (rb'{"question": "hi", "tenant": "\ud83d"}', "body.tenant"),
])
def test_a_lone_surrogate_is_refused_naming_its_field(api: httpx.Client, body: bytes, where: str) -> None:
    refused(api.post("/v1/runs", content=body, headers=JSON), where, "lone surrogate")


def test_a_lone_surrogate_in_a_batch_names_the_run(api: httpx.Client) -> None:
    body = rb'{"runs": [{"question": "hi"}, {"question": "hi", "id": "\ud800"}]}'
    refused(api.post("/v1/batches", content=body, headers=JSON), "body.runs.1.id", "lone surrogate")
    body = rb'{"runs": [{"question": "hi"}], "webhook_url": "https://example.com/\udc00"}'
    refused(api.post("/v1/batches", content=body, headers=JSON), "body.webhook_url", "lone surrogate")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_max_cost_usd_must_be_a_finite_number(api: httpx.Client, value: str) -> None:
    body = f'{{"question": "hi", "max_cost_usd": {value}}}'.encode()
    refused(api.post("/v1/runs", content=body, headers=JSON), "body.max_cost_usd", "finite number")
    body = f'{{"runs": [{{"question": "hi", "max_cost_usd": {value}}}]}}'.encode()
    refused(api.post("/v1/batches", content=body, headers=JSON), "body.runs.0.max_cost_usd", "finite number")
    body = f'{{"question": "hi", "deadline_s": {value}}}'.encode()
    refused(api.post("/v1/runs", content=body, headers=JSON), "body.deadline_s")


@pytest.mark.parametrize(("field", "value"), [("max_cost_usd", "true"), ("max_cost_usd", '"1.5"'),
                                              ("max_steps", "true"), ("max_tokens", '"100"')])
def test_a_number_must_be_a_json_number(api: httpx.Client, field: str, value: str) -> None:
    body = f'{{"question": "hi", "{field}": {value}}}'.encode()
    refused(api.post("/v1/runs", content=body, headers=JSON), f"body.{field}", "should be a")


def test_a_finite_max_cost_usd_is_kept(api: httpx.Client, module_cluster: Cluster) -> None:
    created = api.post("/v1/runs", json={"question": "hi", "max_cost_usd": 0.25, "max_steps": 3.0})
    assert created.status_code == 201, created.text  # 3.0 is a JSON integer
    run = module_cluster.load_run(created.json()["run_id"])
    assert run is not None and run.spec.max_cost_usd == 0.25 and run.spec.max_steps == 3


def test_an_empty_tier_is_refused(api: httpx.Client) -> None:
    """Not the plan's default tier (which is what "" once meant): the document lists the tiers."""
    refused(api.post("/v1/runs", json={"question": "hi", "tier": ""}), "body.tier")
    refused(api.post("/v1/batches", json={"runs": [{"question": "hi"}], "tier": ""}), "body.tier")


@pytest.mark.parametrize("cursor", ["nan", "nan_abc", "inf_abc", "1e999_abc", "12_a:b"])
def test_a_malformed_cursor_is_refused(api: httpx.Client, cursor: str) -> None:
    refused(api.get("/v1/runs", params={"cursor": cursor}), "query.cursor", "next_cursor of the previous page")


def test_a_cursor_from_a_page_is_accepted(api: httpx.Client) -> None:
    for _ in range(3):
        assert api.post("/v1/runs", json={"question": "hi"}).status_code == 201
    first = api.get("/v1/runs", params={"limit": 2}).json()
    assert first["next_cursor"] is not None
    second = api.get("/v1/runs", params={"limit": 2, "cursor": first["next_cursor"]})
    assert second.status_code == 200 and second.json()["runs"]
    assert not {r["run_id"] for r in first["runs"]} & {r["run_id"] for r in second.json()["runs"]}


@pytest.mark.parametrize("before", ["nan", "inf", "-inf"])
def test_a_non_finite_before_is_refused(api: httpx.Client, before: str) -> None:
    refused(api.get("/v1/webhooks/deliveries", params={"before": before}), "query.before", "finite number")


def test_an_offset_past_any_batch_is_refused(api: httpx.Client) -> None:
    batch_id = api.post("/v1/batches", json={"runs": [{"question": "hi"}]}).json()["batch_id"]
    refused(api.get(f"/v1/batches/{batch_id}", params={"offset": 10**30}), "query.offset", "less than or equal")
    page = api.get(f"/v1/batches/{batch_id}", params={"offset": 2**53 - 1})
    assert page.status_code == 200 and page.json()["run_ids"] == []


@pytest.mark.parametrize("last", ["zz", "1-x", "-1", "99999999999999999999-0", "1-2-3", ""])
def test_a_bad_last_event_id_is_refused_before_the_stream(api: httpx.Client, last: str) -> None:
    run_id = api.post("/v1/runs", json={"question": "hi"}).json()["run_id"]  # unfinished: no worker
    response = api.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": last})
    assert response.headers["content-type"] == "application/json"
    refused(response, "Last-Event-ID")


def test_a_good_last_event_id_streams(api: httpx.Client) -> None:
    run_id = api.post("/v1/runs", json={"question": "hi"}).json()["run_id"]
    with api.stream("GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "0-0"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                assert line == "event: queued"
                break


def test_a_batch_of_the_largest_size_is_recorded(api: httpx.Client) -> None:
    """10,000 runs, the most a batch takes: its commands once failed in Lua's unpack (a 503)."""
    created = api.post("/v1/batches", json={"runs": [{"question": "hi"}] * 10_000})
    assert created.status_code == 201, created.text
    batch = api.get(f"/v1/batches/{created.json()['batch_id']}", params={"offset": 9_990}).json()
    assert batch["size"] == 10_000 and batch["run_ids"] == created.json()["run_ids"][9_990:]


def test_wrong_method_names_every_method_of_the_path(api: httpx.Client) -> None:
    response = api.request("PATCH", "/v1/runs")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"  # two routers serve /v1/runs; Starlette named one


def test_a_batch_file_line_with_a_non_finite_budget_is_a_line_error(module_cluster: Cluster, tmp_path: Path) -> None:
    """`reactq batch` reads the same fields: such a line is reported by number, the others go on."""
    lines = ['{"question": "hi", "max_cost_usd": NaN}', '{"question": "hi", "deadline_s": 1e400}',
             json.dumps({"question": "hi", "max_cost_usd": 1.5})]
    infile = tmp_path / "in.jsonl"
    infile.write_text("\n".join(lines) + "\n")
    parsed = [str(p) if not hasattr(p, "spec") else p.spec.max_cost_usd
              for p in iter_input(infile, module_cluster.settings(), None, None)]
    assert parsed == ["line 1: max_cost_usd: Input should be a finite number",
                      "line 2: deadline_s: Input should be a finite number", 1.5]
