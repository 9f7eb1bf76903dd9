"""The UI in a real browser (Debian's chromium, headless, through playwright) against real redis-server,
real `reactq worker` processes, the real `reactq api` and the api_stub: signing in, a run's steps appearing
live as the worker records them, approving from the button, another tenant's run out of reach, a hostile
answer shown as text, the CSRF token required, a phone-width page, and no script error on any page (the
`watched_page` fixture fails the test on any console or page error). With REACTQ_UI_SCREENSHOTS=1 the
pages are written to docs/ui/ for the README."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import (
    CALCULATOR_NEEDS_APPROVAL,
    HOSTILE,
    HOSTILE_QUESTION,
    WatchedPage,
    hostile_corpus,
    open_page,
    operator_key,
    screenshot,
    sign_in,
    submit,
    waiting_cluster,
)
from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl

pytestmark = pytest.mark.integration


def mark(watched: WatchedPage) -> None:
    """Put a marker in the page's JavaScript state: it survives live updates and is lost on a reload."""
    watched.page.evaluate("window.reactqMarker = 'not reloaded'")


def not_reloaded(watched: WatchedPage) -> bool:
    return bool(watched.page.evaluate("window.reactqMarker === 'not reloaded'"))


def test_sign_in_and_the_runs_page(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                   watched_page: WatchedPage) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    for question in ("What is 17 * 23?", "What is the capital of France?", "What is the capital of Italy?"):
        tenancy_cluster.wait_for_run(submit(api, key, question))
    page = watched_page.page
    page.goto(f"{api.url}/ui")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    screenshot(page, "sign-in")
    page.get_by_label("API key").fill("rq_0123456789abcdef_" + "x" * 43)
    watched_page.allow_status(401)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown API key")
    sign_in(page, api.url, key)
    expect(page.get_by_role("navigation", name="Main")).to_contain_text("Runs")
    expect(page.locator("tbody tr")).to_have_count(3)
    expect(page.locator("tbody tr").first).to_contain_text("capital of Italy")  # newest first
    expect(page.locator("#counts")).to_contain_text("succeeded 3")
    page.get_by_label("Status", exact=True).select_option("succeeded")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=succeeded"))
    expect(page.locator("tbody tr")).to_have_count(3)
    screenshot(page, "runs")
    # signing out ends the session: the runs page sends the browser back to the sign-in form
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("status")).to_contain_text("signed out")
    page.goto(f"{api.url}/ui/runs")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_steps_appear_live_and_approve_from_the_button(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                                       stub_control: StubControl,
                                                       watched_page: WatchedPage) -> None:
    tenancy_cluster.env.update(CALCULATOR_NEEDS_APPROVAL)
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    page = watched_page.page
    sign_in(page, api.url, key)
    stub_control.set_faults(latency_ms=1500)  # each model turn takes a while: the page is open before it ends
    run_id = submit(api, key, "What is 6 * 7?")  # no worker yet: the run waits in the queue
    page.goto(f"{api.url}/ui/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("queued")
    expect(page.locator("#steps li")).to_have_count(0)
    mark(watched_page)
    tenancy_cluster.start_worker(concurrency=4)
    approve = page.get_by_role("button", name="Approve")
    expect(approve).to_be_visible(timeout=120_000)  # the request for approval came over the event stream
    expect(page.locator("#run-status")).to_have_text("awaiting_approval")
    assert not_reloaded(watched_page)
    screenshot(page, "run-approval")
    approve.click()  # a form post: the page loads again, then follows the run live
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    mark(watched_page)
    expect(page.locator("#step-1")).to_contain_text("calculator", timeout=120_000)
    expect(page.locator("#step-1 .observation")).to_have_text("42")
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=120_000)
    expect(page.locator("#answer")).to_have_text("42")
    expect(page.locator("#steps li")).to_have_count(2)  # the call, then the final answer
    expect(page.locator("#step-1")).to_contain_text("approved by ui:acme")
    assert not_reloaded(watched_page)  # every step came without a reload
    expect(page.get_by_text("live", exact=True)).to_have_count(0)
    screenshot(page, "run")


def test_another_tenants_run_is_not_reachable(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                             watched_page: WatchedPage) -> None:
    mine, theirs = make_key(tenancy_cluster, "acme", plan="free"), make_key(tenancy_cluster, "rival", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    their_run = submit(api, theirs, "What is the capital of Spain?")
    tenancy_cluster.wait_for_run(their_run)
    page = watched_page.page
    sign_in(page, api.url, mine)
    expect(page.get_by_text("No runs match.")).to_be_visible()
    watched_page.allow_status(404)
    page.goto(f"{api.url}/ui/runs/{their_run}")
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.locator("main")).not_to_contain_text("Spain")


def test_a_hostile_answer_renders_as_text(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                          tmp_path: Path, watched_page: WatchedPage) -> None:
    hostile_corpus(tenancy_cluster, tmp_path)
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    run_id = submit(api, key, HOSTILE_QUESTION)
    assert HOSTILE in tenancy_cluster.wait_for_run(run_id)["answer"]
    page = watched_page.page
    sign_in(page, api.url, key)
    page.goto(f"{api.url}/ui/runs/{run_id}")
    expect(page.locator("#answer")).to_contain_text(HOSTILE)  # the markup, as characters
    expect(page.locator("#answer img")).to_have_count(0)
    expect(page.locator("main script")).to_have_count(0)
    expect(page.locator("#step-1 .observation")).to_contain_text(HOSTILE)
    assert page.evaluate("window.pwned === undefined")  # neither the script nor the onerror ran
    page.goto(f"{api.url}/ui/runs")
    assert page.evaluate("window.pwned === undefined")


def test_the_csrf_token_is_required(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                    watched_page: WatchedPage) -> None:
    api, key, run_id = waiting_cluster(tenancy_cluster, api_server)
    page = watched_page.page
    sign_in(page, api.url, key)
    page.goto(f"{api.url}/ui/runs/{run_id}")
    cancel = page.get_by_role("button", name="Cancel run")
    # Forged as the form is submitted: a live redraw in between (the run reaching its approval) would
    # otherwise bring back a form with the real token.
    page.evaluate("document.addEventListener('submit', e => e.target.querySelectorAll('input[name=csrf_token]')"
                  ".forEach(i => { i.value = 'forged'; }), true)")
    watched_page.allow_status(403)
    cancel.click()
    expect(page.get_by_role("heading", name="Forbidden")).to_be_visible()
    expect(page.locator("main")).to_contain_text("CSRF")
    assert tenancy_cluster.run_status(run_id) == "awaiting_approval"
    page.goto(f"{api.url}/ui/runs/{run_id}")
    page.get_by_role("button", name="Cancel run").click()  # the page's own token: it works
    expect(page.locator("#run-status")).to_have_text("cancelled", timeout=60_000)


def test_a_run_reads_on_a_phone(tenancy_cluster: Cluster, api_server: Callable[..., Api], browser: Browser) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    run_id = submit(api, key, "What is 17 * 23? And what is the capital of France?")
    tenancy_cluster.wait_for_run(run_id)
    phone = open_page(browser, width=390, height=844)
    page = phone.page
    sign_in(page, api.url, key)
    for path in ("/ui/runs", f"/ui/runs/{run_id}"):
        page.goto(f"{api.url}{path}")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), f"{path} scrolls sideways"
    expect(page.locator("#answer")).to_be_visible()
    screenshot(page, "run-phone")
    # keyboard: the skip link is the first stop and moves focus to the main landmark
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.context.close()
    phone.assert_no_errors()


def test_the_operator_sees_every_tenant(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                        watched_page: WatchedPage) -> None:
    acme, rival = make_key(tenancy_cluster, "acme", plan="free"), make_key(tenancy_cluster, "rival", plan="free")
    operator = operator_key(tenancy_cluster)
    api = api_server()
    tenancy_cluster.start_worker(concurrency=4)
    for key, question in ((acme, "What is 12 * 12?"), (rival, "What is the capital of Spain?")):
        tenancy_cluster.wait_for_run(submit(api, key, question))
    page = watched_page.page
    sign_in(page, api.url, operator)
    expect(page.get_by_role("link", name="Operations")).to_be_visible()
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("tbody")).to_contain_text("rival")
    screenshot(page, "runs-operator")
    page.get_by_label("Tenant").select_option("acme")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tbody tr")).to_have_count(1)
    page.locator("tbody a").first.click()
    expect(page.locator("main")).to_contain_text("What is 12 * 12?")
    expect(page.get_by_role("button", name="Replay from this step")).to_have_count(0)  # an operator looks only


def test_the_counts_update_live(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                watched_page: WatchedPage) -> None:
    api, key, run_id = waiting_cluster(tenancy_cluster, api_server)
    page = watched_page.page
    sign_in(page, api.url, key)
    expect(page.locator("#counts")).to_contain_text("awaiting_approval 1")
    mark(watched_page)
    decided = api.client(key).post(f"/v1/runs/{run_id}/approvals", json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    tenancy_cluster.wait_for_run(run_id)
    expect(page.locator("#counts")).to_contain_text("succeeded 1", timeout=60_000)  # polled, not reloaded
    expect(page.locator("#counts")).to_contain_text("awaiting_approval 0")
    assert not_reloaded(watched_page)
