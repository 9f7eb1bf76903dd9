"""The UI tests' helpers: signing in over HTTP (`signed_in`, `form_token`), an operator key, a search
corpus whose document is hostile markup (`hostile_corpus`), and a real browser: Debian's chromium
(/usr/bin/chromium), driven headless by playwright's sync API (no `playwright install`: the browser is the
system's). Each page records its console errors and uncaught page errors; the tests assert there were none.
`screenshot` writes docs/ui/<name>.png when REACTQ_UI_SCREENSHOTS=1 (how the README's pictures are made)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, expect, sync_playwright

from tests.fixtures_api import Api, make_key
from tests.fixtures_cluster import Cluster
from worker.store.tenant_records import TenantStore
from worker.tenancy.tenants import Tenants

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "docs" / "ui"


@dataclass
class WatchedPage:
    """A page and what went wrong in it: console errors and uncaught exceptions."""

    page: Page
    errors: list[str] = field(default_factory=list)
    allowed_statuses: set[int] = field(default_factory=set)  # pages a test loads on purpose (a 404 page)

    def allow_status(self, status: int) -> None:
        """Chromium logs a page answered 4xx as a console error; a test that expects one says so."""
        self.allowed_statuses.add(status)

    def assert_no_errors(self) -> None:
        assert not self.errors, f"script errors in the page: {self.errors}"


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Browser, width: int = 1280, height: int = 900) -> WatchedPage:
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    page = context.new_page()
    watched = WatchedPage(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            status = re.search(r"the server responded with a status of (\d+)", message.text)
            if status is None or int(status[1]) not in watched.allowed_statuses:
                watched.errors.append(f"console: {message.text}")

    def on_error(error: Error) -> None:
        watched.errors.append(f"page error: {error}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    return watched


@pytest.fixture
def watched_page(browser: Browser) -> Iterator[WatchedPage]:
    """A laptop-sized page of its own browser context (its own cookies); no script errors at the end."""
    watched = open_page(browser)
    yield watched
    watched.page.context.close()
    watched.assert_no_errors()


def sign_in(page: Page, base_url: str, key: str) -> None:
    """Sign in through the form, as a person would; ends on the runs page."""
    page.goto(f"{base_url}/ui")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/ui/runs$"))


def screenshot(page: Page, name: str) -> None:
    """docs/ui/<name>.png of the whole page, when REACTQ_UI_SCREENSHOTS=1."""
    if os.environ.get("REACTQ_UI_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


# A model's answer is hostile input: the stub answers from its tools' observations, so a search corpus whose
# one document is markup makes the run's answer that markup.
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\">"
HOSTILE_QUESTION = "What does the release banner read?"


def hostile_corpus(cluster: Cluster, tmp_path: Path) -> None:
    """Workers started after this search a corpus whose document's text is HOSTILE markup."""
    corpus = tmp_path / "hostile.jsonl"
    corpus.write_text(json.dumps({"title": "Release banner", "text": f"The release banner reads {HOSTILE} today."})
                      + "\n")
    cluster.env["REACTQ_SEARCH_CORPUS"] = str(corpus)


CALCULATOR_NEEDS_APPROVAL = {"REACTQ_APPROVAL_TOOLS": '["calculator"]'}


def submit(api: Api, key: str, question: str) -> str:
    """A run submitted over the JSON API; its id."""
    created = api.client(key).post("/v1/runs", json={"question": question})
    assert created.status_code == 201, created.text
    return str(created.json()["run_id"])


def waiting_run(cluster: Cluster, api: Api, key: str) -> str:
    """A run of `key`'s tenant waiting for approval of its calculator call (CALCULATOR_NEEDS_APPROVAL must be
    in the cluster's environment before its workers start)."""
    run_id = submit(api, key, "What is 6 * 7?")
    cluster.wait_for_status(run_id, lambda s: s == "awaiting_approval", "awaiting approval", 120)
    return run_id


def waiting_cluster(cluster: Cluster, start_api: Callable[..., Api]) -> tuple[Api, str, str]:
    """The API and a worker of a cluster whose calculator calls need approval, a key of tenant `acme`, and
    one run of it waiting for approval."""
    cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    key = make_key(cluster, "acme", plan="free")
    api = start_api()
    cluster.start_worker(concurrency=4)
    return api, key, waiting_run(cluster, api, key)


def operator_key(cluster: Cluster) -> str:
    client = redis.Redis.from_url(cluster.env["REACTQ_REDIS_URL"])
    try:
        return Tenants(TenantStore(client), cluster.settings()).create_operator_key().key
    finally:
        client.close()


def form_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no form with a CSRF token"
    return match[1]


def signed_in(api: Api, key: str) -> tuple[httpx.Client, str]:
    """An HTTP client signed in with `key` through the form, and its session's CSRF token."""
    client = httpx.Client(base_url=api.url, timeout=30)
    api.clients.append(client)
    page = client.get("/ui")
    assert page.status_code == 200
    answer = client.post("/ui/sign-in", data={"key": key, "csrf_token": form_token(page.text)})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/runs", answer.text
    runs = client.get("/ui/runs")
    assert runs.status_code == 200
    return client, form_token(runs.text)
