"""The UI's other pages: a trace diff (`/ui/diff?a=RUN&b=RUN`), batches (`/ui/batches`, one batch and its
results JSONL), evaluation reports (`/ui/evals`, one report) and operations (`/ui/ops`, operator only).

They reuse what the CLI and the JSON API use: `diff_traces` (`reactq trace --diff`), `batch_view` and the
batch results line (`reactq batch --out`), the eval report store `reactq eval --report` fills, and the
cluster's Redis state with the workers' published metrics. A tenant sees only its own runs, batches and
reports (another tenant's is the 404 page, like an unknown one); an operator key sees every tenant's.

A stored eval report is our own HTML (every model text in it escaped by worker/evals/report.py) served as
its own page under the UI's strict CSP: its one inline `<style>` is swapped for a link to the same rules
(`/ui/evals/report.css`), so no route needs a looser policy and nothing is framed."""

from __future__ import annotations

import math
import re
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from ...core.models import Run
from ...core.ops_view import ops_view
from ...core.trace_diff import diff_traces
from ...evals import report as eval_report
from ...service.batch_page import batch_page, recent_batches, result_lines, visible
from ...store.eval_reports import REPORT_ID, StoredReport, from_settings
from ...store.ops import OpsStore
from ...tenancy.tenants import TENANT_ID
from ..app_state import RuntimeDep
from ..guards import RUN_ID
from .render import error_page, not_found, render
from .session import OperatorCaller, UiCaller, UiPrincipal

router = APIRouter()
Text200 = Annotated[str, Query(max_length=200)]
_STYLE = re.compile(r"<style>.*?</style>", re.S)
REPORT_CSS = "/ui/evals/report.css"
# what replaces the report's inline <style>: its rules as a stylesheet, and the UI's icon
REPORT_LINKS = (f'<link rel="stylesheet" href="{REPORT_CSS}">'
                '<link rel="icon" href="/ui/static/favicon.svg" type="image/svg+xml">')


def _tenant_filter(rt: RuntimeDep, caller: UiPrincipal, tenant: str) -> str | None:
    """Whose data a page lists: a tenant's own; an operator's choice, by name or id (None: every tenant)."""
    if not caller.is_operator:
        return caller.tenant
    return (rt.tenants.id_of(tenant) or tenant) if tenant and TENANT_ID.fullmatch(tenant) else None


def _run(rt: RuntimeDep, caller: UiPrincipal, run_id: str) -> Run | None:
    if not RUN_ID.fullmatch(run_id):
        return None
    run = rt.store.load_run(run_id)
    return run if run is not None and caller.can_see(run.spec.tenant) else None


# --- trace diff ---------------------------------------------------------------------------------
def diff_page(request: Request, caller: UiCaller, rt: RuntimeDep, a: Text200 = "", b: Text200 = "") -> Response:
    """Two runs side by side, step by step, the first diverging step marked (`reactq trace --diff A B`)."""
    a, b = a.strip(), b.strip()
    if not a or not b:
        return render(request, "pages/diff.html", nav_active="diff", a=a, b=b, diff=None, runs=None)
    run_a, run_b = _run(rt, caller, a), _run(rt, caller, b)
    if run_a is None or run_b is None:
        return not_found(request, f"run {a if run_a is None else b!r}")
    diff = diff_traces(run_a, rt.store.load_steps(a), run_b, rt.store.load_steps(b))
    return render(request, "pages/diff.html", nav_active="diff", a=a, b=b, diff=diff, runs=(run_a, run_b))


router.add_api_route("/diff", diff_page, methods=["GET"], name="ui_diff")
router.add_api_route("/trace-diff", diff_page, methods=["GET"], name="ui_trace_diff")  # the nav's name for it


# --- batches ------------------------------------------------------------------------------------
@router.get("/batches")
def batches_page(request: Request, caller: UiCaller, rt: RuntimeDep, tenant: Text200 = "",
                 before: Text200 = "") -> Response:
    try:
        older = float(before) if before else None
    except ValueError:
        older = math.nan
    if older is not None and not math.isfinite(older):
        return error_page(request, 400, "before: pass the link of the previous page")
    who = _tenant_filter(rt, caller, tenant)
    rows, next_before = recent_batches(rt.store, who, 50, older)
    return render(request, "pages/batches.html", nav_active="batches", rows=rows, next_before=next_before,
                  tenant=who or "", tenants=rt.tenants.ids() if caller.is_operator else [])


@router.get("/batches/{batch_id}")
def batch_detail(request: Request, caller: UiCaller, rt: RuntimeDep, batch_id: str) -> Response:
    page = batch_page(rt.store, batch_id, caller.tenant) if RUN_ID.fullmatch(batch_id) else None
    if page is None:
        return not_found(request, f"batch {batch_id!r}")
    return render(request, "pages/batch.html", nav_active="batches", page=page, row=page.row)


@router.get("/batches/{batch_id}/results.jsonl")
def batch_results(request: Request, caller: UiCaller, rt: RuntimeDep, batch_id: str) -> Response:
    """The batch's results as `reactq batch --out` writes them, streamed a chunk of runs at a time."""
    if not RUN_ID.fullmatch(batch_id) or visible(rt.store, batch_id, caller.tenant) is None:
        return not_found(request, f"batch {batch_id!r}")
    return StreamingResponse(result_lines(rt.store, batch_id), media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="batch-{batch_id}.jsonl"'})


# --- evaluation reports -------------------------------------------------------------------------
def _reports_of(rt: RuntimeDep, tenants: list[str]) -> list[tuple[str, StoredReport]]:
    store = from_settings(rt.redis, rt.settings)
    found = [(t, r) for t in tenants for r in store.list(t)]
    return sorted(found, key=lambda item: -item[1].created_at)


def _all_tenants(rt: RuntimeDep) -> list[str]:
    return sorted(set(rt.tenants.ids()) | set(rt.settings.tenants))


@router.get("/evals")
def evals_page(request: Request, caller: UiCaller, rt: RuntimeDep, tenant: Text200 = "") -> Response:
    who = _tenant_filter(rt, caller, tenant)
    reports = _reports_of(rt, [who] if who else _all_tenants(rt))
    return render(request, "pages/evals.html", nav_active="evals", reports=reports, tenant=who or "",
                  tenants=_all_tenants(rt) if caller.is_operator else [])


def _report(rt: RuntimeDep, caller: UiPrincipal, report_id: str, tenant: str) -> tuple[str, StoredReport] | None:
    if not REPORT_ID.fullmatch(report_id):
        return None
    owner = caller.tenant if caller.tenant is not None else tenant
    if not owner or not TENANT_ID.fullmatch(owner):
        return None
    found = from_settings(rt.redis, rt.settings).get(owner, report_id)
    return (owner, found) if found is not None else None


@router.get("/evals/report.css")
def report_css() -> Response:
    """The stored reports' own rules, as a file (the CSP allows no inline style)."""
    return Response(eval_report.STYLE, media_type="text/css; charset=utf-8")


@router.get("/evals/{report_id}")
def eval_detail(request: Request, caller: UiCaller, rt: RuntimeDep, report_id: str,
                tenant: Text200 = "") -> Response:
    found = _report(rt, caller, report_id, tenant)
    if found is None:
        return not_found(request, "evaluation report")
    owner, report = found
    return render(request, "pages/eval.html", nav_active="evals", report=report, owner=owner,
                  query=f"?tenant={owner}" if caller.is_operator else "")


@router.get("/evals/{report_id}/report.html")
def eval_report_html(request: Request, caller: UiCaller, rt: RuntimeDep, report_id: str,
                     tenant: Text200 = "") -> Response:
    """The stored report itself, its inline style swapped for the stylesheet (and the icon: nothing else)."""
    found = _report(rt, caller, report_id, tenant)
    if found is None or found[1].html is None:
        return not_found(request, "evaluation report")
    html = _STYLE.sub(REPORT_LINKS, found[1].html, count=1)
    return HTMLResponse(html)


# --- operations ---------------------------------------------------------------------------------
def ops_page(request: Request, caller: OperatorCaller, rt: RuntimeDep) -> Response:
    """Queues, workers, rates, tool failures, sandbox pools, provider limits and circuits, the reaper
    (operator only)."""
    limits = {name: (spec.rpm, spec.tpm) for name, spec in rt.settings.models.items() if spec.rpm or spec.tpm}
    # every model a run may call: its limiter cells and its provider circuit
    models = set(rt.settings.models) | {rt.settings.model} | {
        f for spec in rt.settings.models.values() for f in spec.fallbacks}
    raw = OpsStore(rt.redis, rt.broker_redis).read(sorted(models))
    return render(request, "pages/ops.html", nav_active="operations", view=ops_view(raw, limits),
                  now=raw.now)


router.add_api_route("/ops", ops_page, methods=["GET"], name="ui_ops")
router.add_api_route("/operations", ops_page, methods=["GET"], name="ui_operations")  # the nav's name for it
