"""The operator UI under /ui: server-rendered Jinja2 pages, htmx vendored as a static file, a strict CSP
(`headers.UiHeaders`), sessions in Redis (`session`). `create_app` includes `ui_router` and the headers
middleware; `error_response` is the app's HTML answer for errors under /ui."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from . import routes_auth, routes_pages, routes_runs
from .headers import UiHeaders
from .render import error_page

__all__ = ["UiHeaders", "error_response", "is_ui", "ui_router"]

STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png",
          ".svg": "image/svg+xml"}

ui_router = APIRouter(prefix="/ui", include_in_schema=False)


@ui_router.get("/static/{name}")
def static_file(name: str) -> Response:
    """One file of static/ by its plain name (no paths), cached for an hour."""
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES or not path.is_file():
        raise HTTPException(404, f"no static file {name!r}")
    return FileResponse(path, media_type=_TYPES[path.suffix], headers={"Cache-Control": "public, max-age=3600"})


ui_router.add_api_route("", routes_auth.sign_in_page, methods=["GET"], name="ui_sign_in_page")
ui_router.include_router(routes_auth.router)
ui_router.include_router(routes_runs.router)
ui_router.include_router(routes_pages.router)


def is_ui(request: Request) -> bool:
    path = request.url.path
    return path == "/ui" or path.startswith("/ui/")


def error_response(request: Request, status_code: int, message: str, headers: Mapping[str, str] | None) -> Response:
    """An error under /ui as a page (a 303 from `session.to_sign_in` as the redirect it names)."""
    if status_code in (302, 303) and headers and "Location" in headers:
        return RedirectResponse(headers["Location"], status_code=303)
    return error_page(request, status_code, message)
