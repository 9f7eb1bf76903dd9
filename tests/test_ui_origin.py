"""Nothing on the API's origin (which is the UI's) loads anything from another origin (docs/decisions/ui-access.md):
a real browser (tests/fixtures_browser.py) signs in and opens every page a person reaches, a run's page
included, and the API's documentation addresses; every request it makes goes to the API's own origin.
FastAPI's /docs and /redoc pages loaded swagger-ui and redoc from a CDN, unpinned and with no CSP, where
their script could read the signed-in UI: they are not served."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Request, expect

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import WatchedPage, sign_in, submit
from tests.fixtures_cluster import Cluster

pytestmark = pytest.mark.integration


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def test_no_page_on_the_origin_requests_another_origin(cluster: Cluster, api_server: Callable[..., Api],
                                                       watched_page: WatchedPage) -> None:
    key = make_key(cluster, "default")
    api = api_server()
    cluster.start_worker(queues="steps", concurrency=2)
    run_id = submit(api, key, "What is 6 * 7?")
    cluster.wait_for_run(run_id)
    page = watched_page.page
    requested: list[str] = []

    def on_request(request: Request) -> None:
        requested.append(request.url)

    page.on("request", on_request)
    watched_page.allow_status(404)  # the documentation addresses below, and a browser's /favicon.ico
    sign_in(page, api.url, key)
    for path in ("/ui/runs", f"/ui/runs/{run_id}", "/ui/batches", "/ui/evals", "/ui/diff", "/openapi.json"):
        assert page.goto(f"{api.url}{path}").status == 200, path  # type: ignore[union-attr]
        page.wait_for_load_state("networkidle")
    expect(page.locator("body")).to_contain_text("openapi")
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = page.goto(f"{api.url}{path}")
        page.wait_for_load_state("networkidle")
        assert answer is not None and answer.status == 404, path
    assert len(requested) > 10 and f"{api.url}/ui/static/" in " ".join(requested)
    assert {_origin(url) for url in requested} == {api.url}, sorted(set(requested))
