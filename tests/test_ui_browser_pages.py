"""The trace diff, batches, evaluation reports and operations pages in a real browser (Debian's chromium,
headless, through playwright: tests/fixtures_browser.py) against a real `reactq api`, workers, Redis and
the api_stub. Each page is checked for its content, and for no script errors (a CSP violation is one).
With REACTQ_UI_SCREENSHOTS=1 they write docs/ui/{batches,batch,diff,evals,eval-report,ops}.png."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, ConsoleMessage, Dialog, expect

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import (
    HOSTILE,
    HOSTILE_QUESTION,
    WatchedPage,
    hostile_corpus,
    open_page,
    operator_key,
    screenshot,
    sign_in,
    submit,
)
from tests.fixtures_cluster import Cluster
from tests.test_ui_pages import BATCH, QUESTION, hostile_report, run_batch, stored_eval

pytestmark = pytest.mark.integration


def forgive(watched: WatchedPage, urls: Callable[[str], bool]) -> None:
    """Drop the console's "Failed to load resource" errors of the URLs `urls` accepts: the pages whose 404
    or 403 is what the test asks for. Every other console error still fails the test."""

    def on_console(message: ConsoleMessage) -> None:
        text = f"console: {message.text}"
        if message.type == "error" and urls(message.location.get("url", "")) and text in watched.errors:
            watched.errors.remove(text)  # the fixture's own listener, registered first, has recorded it

    watched.page.on("console", on_console)


def no_dialogs(watched: WatchedPage) -> list[str]:
    """Every alert() the page opens (a hostile text that ran as script would open one)."""
    opened: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        opened.append(dialog.message)
        dialog.dismiss()

    watched.page.on("dialog", on_dialog)
    return opened


def test_batches_diff_and_eval_pages_in_a_browser(tenancy_cluster: Cluster, api_server: Callable[..., Api],
                                                  browser: Browser, watched_page: WatchedPage,
                                                  tmp_path: Path) -> None:
    c = tenancy_cluster
    acme, other = make_key(c, "acme", "pro"), make_key(c, "other", "free")
    c.start_worker()
    out, lines, batch_id = run_batch(c, tmp_path, [*BATCH, {"id": "q4", "question": "Who painted the Mona Lisa?"}])
    stored_eval(c, tmp_path, 4)
    hostile_id, _ = hostile_report(c, "acme", "hostile.jsonl")
    api = api_server()
    tenant_api = api.client(acme)
    source = tenant_api.post("/v1/runs", json={"question": QUESTION}).json()["run_id"]
    c.wait_for_run(source)
    fork = tenant_api.post(f"/v1/runs/{source}/replay", json={"from_step": 2, "mode": "text"}).json()["run_id"]
    c.wait_for_run(fork)

    page = watched_page.page
    dialogs = no_dialogs(watched_page)
    sign_in(page, api.url, acme)

    # batches: the list, then the batch through its link
    page.get_by_role("link", name="Batches").click()
    expect(page.get_by_role("heading", name="Batches")).to_be_visible()
    row = page.locator(f'tr[data-batch="{batch_id}"]')
    expect(row).to_contain_text("4 / 4")
    screenshot(page, "batches")
    row.get_by_role("link").click()
    expect(page.locator("#progress-figures")).to_have_text("4 of 4 runs finished (100%)")
    expect(page.locator("#progress")).to_have_attribute("value", "4")
    failed = next(line for line in lines if line["id"] == "q3")
    expect(page.locator(f'#statuses li[data-status="{failed["status"]}"]')).to_contain_text("1")
    expect(page.locator('#statuses li[data-status="succeeded"]')).to_contain_text("3")
    expect(page.locator("#failed")).to_contain_text("q3")
    expect(page.locator("#slowest tbody tr")).to_have_count(4)
    screenshot(page, "batch")
    with page.expect_download() as download:
        page.locator("#download").click()
    assert Path(download.value.path()).read_text() == out.read_text()

    # the trace diff, through its form
    page.get_by_role("link", name="Trace diff").click()
    page.get_by_label("Run A").fill(source)
    page.get_by_label("Run B").fill(fork)
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#diverges-at")).to_have_text("2")
    marked = page.locator("#first-divergence")
    expect(marked).to_have_attribute("data-step", "2")
    expect(marked).to_contain_text("first divergence")
    expect(page.locator('tr[data-step="1"]')).to_have_attribute("data-same", "yes")
    screenshot(page, "diff")

    # evaluation reports: listed, opened, the full report styled under the strict CSP, hostile text inert
    page.get_by_role("link", name="Evaluations").click()
    expect(page.get_by_role("link", name="subset.jsonl")).to_be_visible()
    screenshot(page, "evals")
    page.get_by_role("link", name="subset.jsonl").click()
    expect(page.locator("#summary")).to_contain_text("4 of 4")
    page.locator("#open-report").click()
    expect(page.get_by_role("heading", name="reactq eval: subset.jsonl")).to_be_visible()
    expect(page.locator("#questions tr")).to_have_count(5)
    header_colour = page.locator("#summary th").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert header_colour == "rgb(243, 243, 243)"  # report.css applied (the inline <style> would be refused)
    screenshot(page, "eval-report")
    page.goto(f"{api.url}/ui/evals/{hostile_id}/report.html")
    expect(page.locator("#questions")).to_contain_text("<script>alert(1)</script>?")
    expect(page.locator("#questions")).to_contain_text("<img src=x onerror=alert(2)> 42")
    assert page.locator("#questions img").count() == 0 and page.locator("body script").count() == 0
    assert dialogs == []

    # on a phone: every page fits its width (wide tables scroll inside their own box)
    phone = open_page(browser, width=390, height=844)
    try:
        sign_in(phone.page, api.url, acme)
        for path, name in ((f"/ui/batches/{batch_id}", "batch-phone"), (f"/ui/diff?a={source}&b={fork}", None),
                           ("/ui/batches", None), ("/ui/evals", None)):
            phone.page.goto(api.url + path)
            width = phone.page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} is {width}px wide on a 390px screen"
            if name:
                screenshot(phone.page, name)
        phone.assert_no_errors()
    finally:
        phone.page.context.close()

    # another tenant's batch, run diff and report are the 404 page; the operations page is not theirs
    theirs = open_page(browser)
    refused = {f"{api.url}/ui/batches/{batch_id}", f"{api.url}/ui/diff?a={source}&b={fork}",
               f"{api.url}/ui/evals/{hostile_id}", f"{api.url}/ui/ops"}
    forgive(theirs, lambda url: url in refused)
    try:
        sign_in(theirs.page, api.url, other)
        for path in (f"/ui/batches/{batch_id}", f"/ui/diff?a={source}&b={fork}", f"/ui/evals/{hostile_id}"):
            theirs.page.goto(api.url + path)
            expect(theirs.page.get_by_role("heading", name="Not found")).to_be_visible()
        theirs.page.goto(f"{api.url}/ui/ops")
        expect(theirs.page.get_by_role("heading", name="Forbidden")).to_be_visible()
        expect(theirs.page.get_by_role("link", name="Operations")).to_have_count(0)
        theirs.assert_no_errors()
    finally:
        theirs.page.context.close()


def test_ops_and_batch_pages_in_a_browser_show_queue_depths_and_refresh_themselves(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], browser: Browser,
        watched_page: WatchedPage, tmp_path: Path) -> None:
    c = tenancy_cluster
    hostile_corpus(c, tmp_path)  # a search answers with markup: the trace diff below shows it as text
    acme = make_key(c, "acme", "pro")
    api = api_server()
    questions = [*(f"What is {i} * 3?" for i in range(3)), "What is 1 / 0?"]  # the last: a tool failure
    created = api.client(acme).post("/v1/batches", json={"runs": [{"question": q} for q in questions]})
    assert created.status_code == 201, created.text
    page = watched_page.page
    sign_in(page, api.url, operator_key(c))
    page.get_by_role("link", name="Operations").click()
    expect(page.get_by_role("heading", name="Operations")).to_be_visible()
    steps = page.locator('#queues tr[data-queue="reactq.steps"]')
    expect(steps.locator('[data-figure="depth"]')).to_have_text("4")
    depths = [int(t) for t in steps.locator("td[data-priority]").all_inner_texts()]
    assert sum(depths) == 4 and depths[0] == 0  # batch runs wait at priority 2 and below
    expect(page.locator("#no-processes")).to_be_visible()
    screenshot(page, "ops-queued")
    page.evaluate("window.notReloaded = true")  # a reload would lose it
    batch = open_page(browser)
    sign_in(batch.page, api.url, acme)
    batch.page.goto(f"{api.url}/ui/batches/{created.json()['batch_id']}")
    expect(batch.page.locator("#progress-figures")).to_have_text("0 of 4 runs finished (0%)")
    batch.page.evaluate("window.notReloaded = true")
    stranded = api.client(acme).post("/v1/runs", json={"question": "What is 9 * 9?"}).json()["run_id"]
    client = redis.Redis.from_url(c.env["REACTQ_REDIS_URL"])
    assert client.delete("reactq.steps") == 1  # its message is lost: the reaper's to find
    c.start_worker()
    for run_id in [*created.json()["run_ids"], stranded]:
        c.wait_for_run(run_id)
    # no reload: the page asks for itself again every 10 s (htmx) and shows the workers' figures
    expect(page.locator("#processes")).to_contain_text("reactq.steps", timeout=60_000)
    expect(steps.locator('[data-figure="depth"]')).to_have_text("0", timeout=60_000)
    expect(page.locator(f'#reaped tr[data-run="{stranded}"]')).to_contain_text("lost_message", timeout=60_000)
    expect(page.locator('#tool-failures tr[data-tool="calculator"]')).to_contain_text("division_by_zero")
    assert page.evaluate("window.notReloaded") is True
    # the batch page follows its batch to the end the same way (every 5 s), then stops asking
    expect(batch.page.locator("#progress-figures")).to_have_text("4 of 4 runs finished (100%)", timeout=60_000)
    expect(batch.page.locator('#statuses li[data-status="succeeded"]')).to_contain_text("4")
    expect(batch.page.locator("#batch-live")).not_to_have_attribute("hx-trigger", "every 5s")
    assert batch.page.evaluate("window.notReloaded") is True
    # a model's answer is hostile input: on the trace diff it is text, and nothing of it runs
    hostile = submit(api, acme, HOSTILE_QUESTION)
    assert HOSTILE in c.wait_for_run(hostile)["answer"]
    batch.page.goto(f"{api.url}/ui/diff?a={hostile}&b={hostile}")
    expect(batch.page.locator("#diff-steps")).to_contain_text(HOSTILE)
    expect(batch.page.locator("main")).to_contain_text(HOSTILE)  # the answers, side by side
    assert batch.page.locator("main img, main script").count() == 0
    assert batch.page.evaluate("window.pwned") is None
    batch.assert_no_errors()
    batch.page.context.close()
    screenshot(page, "ops")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # readable on a phone too
    assert client.zcard("reactq:workers:snapshots") >= 1
    client.close()
