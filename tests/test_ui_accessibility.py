"""The operator UI checked by a real accessibility engine: axe-core (vendored as a test asset under
tests/assets/, never shipped) runs in Debian's chromium against every UI page, at a laptop's width (1280 px)
and a phone's (390 px), with real runs from real redis-server, `reactq worker` processes, `reactq api` and
the api_stub. Every WCAG 2.1 A/AA rule must pass, and on the UI's own pages axe's best practices too. axe
goes into the page through playwright's `evaluate` (the DevTools protocol, which a page's CSP does not
govern): the page keeps its strict CSP, and each response is checked to still carry it. A second test walks
the page with the keyboard: the skip link is the first Tab stop, then the main navigation, each with a
visible focus style."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import CALCULATOR_NEEDS_APPROVAL, WatchedPage, open_page, operator_key, sign_in, submit
from tests.fixtures_cluster import Cluster
from tests.test_ui_pages import QUESTION, hostile_report, run_batch, stored_eval
from worker.api.ui.headers import CSP

pytestmark = pytest.mark.integration

AXE = Path(__file__).parent / "assets" / "axe-core-4.14.1" / "axe.min.js"
WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
# The UI's own templates are also held to axe's best practices (one main landmark, all content in landmarks,
# unique landmarks, heading order); the stored eval report is the report writer's page, held to WCAG only.
WITH_BEST_PRACTICE = [*WCAG_21_AA, "best-practice"]
WIDTHS = {"laptop": (1280, 900), "phone": (390, 844)}
RUN_AXE = """async (tags) => {
  const results = await axe.run(document, {runOnly: {type: "tag", values: tags}, resultTypes: ["violations"]});
  return {passed: results.passes.length, violations: results.violations.map(v => ({id: v.id, impact: v.impact,
    help: v.help, targets: v.nodes.map(n => n.target.join(" ")), summaries: v.nodes.map(n => n.failureSummary)}))};
}"""


def test_the_vendored_axe_is_the_recorded_one() -> None:
    digest = hashlib.sha256(AXE.read_bytes()).hexdigest()
    assert f"`axe.min.js` sha256: {digest}" in (AXE.parent / "SOURCE.md").read_text()
    assert AXE.read_text()[:40].startswith("/*! axe v4.14.1") and (AXE.parent / "LICENSE").is_file()


def violations(page: Page, tags: list[str] = WITH_BEST_PRACTICE) -> list[dict]:
    """axe's violations of the rules of `tags` in the page as it is now."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())  # through the DevTools protocol: the page's CSP does not apply
    results = page.evaluate(RUN_AXE, tags)
    assert results["passed"] > 10, f"axe checked almost nothing: {results}"  # it did run its rules
    return list(results["violations"])


def described(where: str, found: list[dict]) -> str:
    return "\n".join(f"{where}: {v['id']} ({v['impact']}) {v['help']}; at {v['targets']}; {v['summaries'][:2]}"
                     for v in found)


def check(watched: WatchedPage, url: str, name: str, status: int = 200,
          tags: list[str] = WITH_BEST_PRACTICE) -> list[str]:
    """Load `url`, check its status and CSP header, and describe each axe violation in it."""
    if status != 200:
        watched.allow_status(status)
    response = watched.page.goto(url)
    assert response is not None and response.status == status, f"{name}: {response and response.status}"
    assert response.headers.get("content-security-policy") == CSP, f"{name} lost its CSP"
    watched.page.wait_for_load_state("networkidle")
    found = violations(watched.page, tags)
    return [described(name, found)] if found else []


def refused_sign_in(watched: WatchedPage, name: str) -> list[str]:
    watched.allow_status(401)
    watched.page.get_by_label("API key").fill("rq_0123456789abcdef_" + "x" * 43)
    watched.page.get_by_role("button", name="Sign in").click()
    expect(watched.page.get_by_role("alert")).to_contain_text("unknown API key")
    found = violations(watched.page)
    return [described(name, found)] if found else []


def test_every_page_passes_axe_wcag21_aa_at_laptop_and_phone_width(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], browser: Browser, tmp_path: Path) -> None:
    c = tenancy_cluster
    acme = make_key(c, "acme", "pro")
    make_key(c, "other", "free")  # a second tenant: the operator's tenant filters have a choice
    operator = operator_key(c)
    worker = c.start_worker(concurrency=8)
    _, _, batch_id = run_batch(c, tmp_path, [{"id": "q1", "question": "What is 6 * 7?"},
                                             {"id": "q2", "question": QUESTION, "max_steps": 1}])
    stored_eval(c, tmp_path, 2)
    report_id, _ = hostile_report(c, "acme", "hostile.jsonl")
    api = api_server()
    source = submit(api, acme, QUESTION)
    c.wait_for_run(source)
    fork = api.client(acme).post(f"/v1/runs/{source}/replay", json={"from_step": 2, "mode": "text"})
    assert fork.status_code in (200, 201), fork.text
    fork_id = fork.json()["run_id"]
    c.wait_for_run(fork_id)
    c.kill(worker)  # the next worker asks for approval of every calculator call
    c.start_worker(concurrency=4, **CALCULATOR_NEEDS_APPROVAL)
    waiting = submit(api, acme, "What is 6 * 7?")
    c.wait_for_status(waiting, lambda s: s == "awaiting_approval", "awaiting approval", 120)

    tenant_pages = [("runs", "/ui/runs", 200), ("run with steps", f"/ui/runs/{source}", 200),
                    ("run awaiting approval", f"/ui/runs/{waiting}", 200),
                    ("trace diff form", "/ui/trace-diff", 200), ("trace diff", f"/ui/diff?a={source}&b={fork_id}", 200),
                    ("batches", "/ui/batches", 200), ("batch", f"/ui/batches/{batch_id}", 200),
                    ("evals", "/ui/evals", 200), ("eval report", f"/ui/evals/{report_id}", 200),
                    ("eval report's HTML", f"/ui/evals/{report_id}/report.html", 200),
                    ("404 page", "/ui/runs/no-such-run", 404), ("403 page", "/ui/ops", 403)]
    operator_pages = [("runs as operator", "/ui/runs", 200), ("batches as operator", "/ui/batches", 200),
                      ("evals as operator", "/ui/evals", 200), ("ops", "/ui/ops", 200)]
    failures: list[str] = []
    for width_name, (width, height) in WIDTHS.items():
        for key, pages in ((None, [("sign-in", "/ui", 200)]), (acme, tenant_pages), (operator, operator_pages)):
            watched = open_page(browser, width, height)
            try:
                if key is not None:
                    sign_in(watched.page, api.url, key)
                for name, path, status in pages:
                    tags = WITH_BEST_PRACTICE
                    failures += check(watched, api.url + path, f"{name} at {width_name} width", status, tags)
                if key is None:  # the sign-in form again, showing its error for an unknown key
                    failures += refused_sign_in(watched, f"sign-in refused at {width_name} width")
                watched.assert_no_errors()
            finally:
                watched.page.context.close()
    # axe would see a violation: an unlabelled field and low-contrast text added to a page are found
    watched = open_page(browser)
    try:
        watched.page.goto(f"{api.url}/ui")
        watched.page.evaluate("""() => { document.querySelector("main").append(document.createElement("input"));
          document.querySelector("main h1").style.color = "#cccccc"; }""")
        assert {"label", "color-contrast"} <= {v["id"] for v in violations(watched.page)}
        # and axe's way in left the CSP in force: an inline script the page adds itself is still refused
        watched.page.evaluate("""() => { const s = document.createElement("script");
          s.textContent = "window.inlineRan = true"; document.body.append(s); }""")
        assert watched.page.evaluate("window.inlineRan") is None
        assert any("Content Security Policy" in e for e in watched.errors), watched.errors
    finally:
        watched.page.context.close()
    assert not failures, "axe-core found violations:\n" + "\n".join(failures)


def focus_style(page: Page) -> dict:
    return dict(page.evaluate("""() => { const s = getComputedStyle(document.activeElement);
      return {outline: s.outlineStyle, width: s.outlineWidth, shadow: s.boxShadow}; }"""))


def visibly_focused(page: Page) -> bool:
    style = focus_style(page)
    return (style["outline"] != "none" and style["width"] != "0px") or style["shadow"] != "none"


def test_the_keyboard_reaches_the_skip_link_then_the_navigation_with_a_visible_focus(
        tenancy_cluster: Cluster, api_server: Callable[..., Api], browser: Browser) -> None:
    key = make_key(tenancy_cluster, "acme", "free")
    api = api_server()
    for width, height in WIDTHS.values():
        watched = open_page(browser, width, height)
        page = watched.page
        try:
            page.goto(f"{api.url}/ui")  # the sign-in form's one field has the focus; before it, the skip link
            expect(page.get_by_label("API key")).to_be_focused()
            assert visibly_focused(page), f"the key field's focus is invisible: {focus_style(page)}"
            page.keyboard.press("Shift+Tab")
            expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
            assert visibly_focused(page), f"the skip link's focus is invisible: {focus_style(page)}"
            sign_in(page, api.url, key)
            page.keyboard.press("Tab")
            expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
            assert page.get_by_role("link", name="Skip to content").is_visible()
            nav = page.get_by_role("navigation", name="Main").get_by_role("link")
            names = nav.all_inner_texts()
            assert names[:4] == ["Runs", "Batches", "Trace diff", "Evaluations"]
            for name in names:
                page.keyboard.press("Tab")
                focused = page.evaluate("document.activeElement.textContent.trim()")
                assert focused == name, f"Tab reached {focused!r}, not the nav link {name!r}"
                assert visibly_focused(page), f"{name}: focus is invisible: {focus_style(page)}"
            page.keyboard.press("Tab")  # then sign-out, also with a visible focus
            expect(page.get_by_role("button", name="Sign out")).to_be_focused()
            assert visibly_focused(page), f"sign out: {focus_style(page)}"
            watched.assert_no_errors()
        finally:
            page.context.close()
