"""Signing in to the UI (`GET /ui`, `POST /ui/sign-in`) and out (`POST /ui/sign-out`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from ..app_state import Reads, no_auth_tenant_of
from . import session
from .render import render

router = APIRouter()

_SIGNED_OUT = {"expired": "Your session has ended; sign in again.",
               "revoked": "You were signed out: the key was revoked, or its tenant removed.",
               "out": "You are signed out."}


async def sign_in_page(request: Request, reads: Reads, signed_out: str | None = None) -> Response:
    """`GET /ui` (added to ui_router itself: an included router cannot have an empty path): the sign-in
    form; a signed-in caller goes on to the runs."""
    token = request.cookies.get(session.COOKIE)
    if (token or no_auth_tenant_of(request) is not None) and signed_out is None:
        try:
            await session.ui_caller(request, reads)
            return RedirectResponse("/ui/runs", 303)
        except HTTPException:  # signed out meanwhile: show the form
            pass
    return _form(request, 200, None, _SIGNED_OUT.get(signed_out or ""))


def _form(request: Request, status: int, error: str | None, notice: str | None) -> Response:
    response = Response()
    token = session.sign_in_token(request, response)
    page = render(request, "sign_in.html", status, nav_active="sign-in", sign_in_csrf=token, error=error,
                  notice=notice, caller=None)
    page.raw_headers.extend(h for h in response.raw_headers if h[0] == b"set-cookie")
    return page


@router.post("/sign-in")
async def sign_in(request: Request, reads: Reads, key: Annotated[str, Form(max_length=200)] = "",
                  csrf_token: Annotated[str, Form(max_length=200)] = "") -> Response:
    session.check_sign_in_token(request, csrf_token)
    response = RedirectResponse("/ui/runs", 303)
    refused = await session.sign_in(request, reads, key, response, request.app.state.runtime.settings.ui_session_ttl_s,
                                    session.secure_cookies(request))
    if refused is not None:
        return _form(request, 401, refused, None)
    return response


@router.post("/sign-out")
async def sign_out(request: Request, reads: Reads, caller: session.CsrfChecked) -> Response:
    response = RedirectResponse("/ui?signed_out=out", 303)
    await session.sign_out(request, reads, response, session.secure_cookies(request))
    return response
