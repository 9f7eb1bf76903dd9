"""Pages from Jinja2 templates (templates/, autoescaped, StrictUndefined): `render` gives every page the
signed-in caller, its CSRF token and the active nav entry. Run data is hostile input: templates never mark
it `|safe`."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from ...core.tenant_ids import tenant_name
from .session import csrf_token

TEMPLATES = Path(__file__).parent / "templates"

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html"]),
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _when(epoch: float | None) -> str:
    """A time as UTC, to the second ("" for none)."""
    if epoch is None:
        return ""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    """A structured answer's object (or its schema) as indented JSON text (autoescaped like any text)."""
    return json.dumps(value, ensure_ascii=False, indent=2)


_env.filters["when"] = _when
_env.filters["pretty"] = _pretty
_env.filters["tenant_name"] = tenant_name  # a tenant's id shown as its name (core/tenant_ids.py)


def render(request: Request, template_name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The page `template_name` with `context` and the caller, CSRF token and `nav_active` of every page."""
    context.setdefault("nav_active", "")
    context.setdefault("caller", getattr(request.state, "ui_caller", None))
    context.setdefault("csrf_token", csrf_token(request))
    html = _env.get_template(template_name).render(request=request, **context)
    return HTMLResponse(html, status_code=status_code)


def not_found(request: Request, what: str) -> HTMLResponse:
    """The 404 page: `what` was not found (or is another tenant's: the same page)."""
    return render(request, "error.html", 404, title="Not found", message=f"No {what}.")


def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    titles = {400: "Bad request", 403: "Forbidden", 404: "Not found", 409: "Conflict", 422: "Invalid input",
              429: "Too many requests", 503: "Unavailable"}
    return render(request, "error.html", status_code, title=titles.get(status_code, "Error"), message=message)
