"""Who is signed in to the UI: a server-side session in Redis (worker/store/ui_sessions.py) named by a
random cookie token, re-checked against the key's record on every request, and the CSRF token of its forms.

The cookie holds only a random 256-bit token (HttpOnly, SameSite=Strict, Path=/ui, Max-Age the session's
TTL, Secure on https); Redis holds the session under the token's SHA-256, with the key's id (never the key),
its tenant or the operator mark, and the session's CSRF token. Signing out deletes the session, so a copied
cookie is useless afterwards; a revoked key or a removed tenant signs every session of it out on its next
request. No secret is needed, so several API processes agree without configuration.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, HTTPException, Request
from fastapi.responses import Response

from ...store.async_reads import AsyncReads
from ...store.ui_sessions import UiSessions
from ...tenancy.tenants import KeyStatus, Tenants
from ..app_state import Reads, no_auth_tenant_of
from ..auth import key_tenant_record

COOKIE = "reactq_ui"
SIGN_IN_COOKIE = "reactq_ui_signin"  # the sign-in form's own CSRF token (double submit), before a session
SIGN_IN_TTL_S = 3600
PATH = "/ui"


@dataclass(frozen=True)
class UiPrincipal:
    key_id: str
    tenant: str | None  # None: an operator key
    csrf: str

    @property
    def is_operator(self) -> bool:
        return self.tenant is None

    def can_see(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def sessions(reads: AsyncReads) -> UiSessions:
    return UiSessions(reads.client)


def to_sign_in(reason: str | None = None) -> HTTPException:
    """Back to the sign-in page (a 303; the app's error handler turns it into the redirect)."""
    return HTTPException(303, "sign in", headers={"Location": PATH + (f"?signed_out={reason}" if reason else "")})


async def key_refusal_reason(request: Request, reads: AsyncReads, record: dict[str, str]) -> str | None:
    """None while a key's record still authorises a UI session, else why not (`revoked`, `unknown`)."""
    if not record.get("sha256"):
        return "unknown"
    if record.get("revoked_at"):
        return "revoked"
    if not record.get("operator"):
        try:
            await key_tenant_record(request, reads, record["tenant"])
        except HTTPException:
            return "revoked"
    return None


async def ui_caller(request: Request, reads: Reads) -> UiPrincipal:
    """The signed-in caller, re-checked now; not signed in (or no longer allowed): a 303 to /ui."""
    cached = getattr(request.state, "ui_caller", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    no_auth = no_auth_tenant_of(request)
    if no_auth is not None:  # `reactq api --insecure-no-auth` (loopback only): no sign-in, as for /v1
        request.state.ui_caller = UiPrincipal("", no_auth, _process_csrf(request))
        return request.state.ui_caller  # type: ignore[no-any-return]
    token = request.cookies.get(COOKIE, "")
    if not token or len(token) > 100:
        raise to_sign_in()
    store = sessions(reads)
    session = await store.get(_digest(token))
    if not session:
        raise to_sign_in("expired")
    record = await reads.api_key(session["key_id"])
    if record.get("sha256") != session.get("sha256") or await key_refusal_reason(request, reads, record):
        await store.delete(_digest(token))
        raise to_sign_in("revoked")
    principal = UiPrincipal(session["key_id"], None if session.get("operator") else session["tenant"], session["csrf"])
    request.state.ui_caller = principal

    async def recheck(stream_reads: AsyncReads) -> None:  # an open event stream asks again on every read
        again = await stream_reads.api_key(principal.key_id)
        ended = not await sessions(stream_reads).get(_digest(token))
        if ended or await key_refusal_reason(request, stream_reads, again):
            raise HTTPException(403, "signed out: this session's key was revoked or the session ended")

    request.state.recheck_key = recheck
    return principal


def _process_csrf(request: Request) -> str:
    """Without sessions (--insecure-no-auth), the forms' CSRF token is one per API process."""
    state = request.app.state
    if getattr(state, "ui_csrf", None) is None:
        state.ui_csrf = secrets.token_urlsafe(32)
    return str(state.ui_csrf)


async def operator_caller(caller: Annotated[UiPrincipal, Depends(ui_caller)]) -> UiPrincipal:
    if not caller.is_operator:
        raise HTTPException(403, "this page is for an operator key (reactq key create --operator)")
    return caller


UiCaller = Annotated[UiPrincipal, Depends(ui_caller)]
OperatorCaller = Annotated[UiPrincipal, Depends(operator_caller)]


async def sign_in(request: Request, reads: AsyncReads, key: str, response: Response, ttl_s: int,
                  secure: bool) -> str | None:
    """Open a session for `key` and set its cookie on `response`; else the refusal to show (None: done)."""
    key = key.strip()
    key_id = Tenants.parse_key(key)
    record = await reads.api_key(key_id) if key_id else {}
    status = Tenants.check(key, record) if key_id else KeyStatus.UNKNOWN
    if status == KeyStatus.UNKNOWN:
        return "unknown API key"
    if status == KeyStatus.REVOKED or await key_refusal_reason(request, reads, record):
        return "this API key has been revoked, or its tenant no longer exists"
    assert key_id is not None
    token = secrets.token_urlsafe(32)
    await sessions(reads).create(_digest(token), {
        "key_id": key_id, "sha256": record["sha256"], "tenant": record.get("tenant", ""),
        "operator": record.get("operator", ""), "csrf": secrets.token_urlsafe(32), "created_at": str(time.time()),
    }, ttl_s)
    response.set_cookie(COOKIE, token, max_age=ttl_s, path=PATH, secure=secure, httponly=True, samesite="strict")
    response.delete_cookie(SIGN_IN_COOKIE, path=PATH, secure=secure, httponly=True, samesite="strict")
    return None


async def sign_out(request: Request, reads: AsyncReads, response: Response, secure: bool) -> None:
    token = request.cookies.get(COOKIE, "")
    if token:
        await sessions(reads).delete(_digest(token))
    response.delete_cookie(COOKIE, path=PATH, secure=secure, httponly=True, samesite="strict")


def secure_cookies(request: Request) -> bool:
    return request.url.scheme == "https" or bool(request.app.state.runtime.settings.ui_cookie_secure)


def sign_in_token(request: Request, response: Response) -> str:
    """The sign-in form's CSRF token: the one its cookie holds, or a new one set on `response`."""
    token = request.cookies.get(SIGN_IN_COOKIE, "")
    if not 20 <= len(token) <= 100:
        token = secrets.token_urlsafe(32)
        response.set_cookie(SIGN_IN_COOKIE, token, max_age=SIGN_IN_TTL_S, path=PATH,
                            secure=secure_cookies(request), httponly=True, samesite="strict")
    return token


def csrf_token(request: Request) -> str:
    """The CSRF token of the signed-in caller's forms ("" before `ui_caller` ran)."""
    caller = getattr(request.state, "ui_caller", None)
    return caller.csrf if caller is not None else ""


def _same(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


async def csrf_checked(caller: UiCaller, csrf_token: Annotated[str, Form(max_length=200)] = "") -> UiPrincipal:
    """A state-changing form's caller, once its `csrf_token` field matched the session's (403 otherwise)."""
    if not _same(csrf_token, caller.csrf):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page and try again")
    return caller


def check_sign_in_token(request: Request, form_token: str) -> None:
    if not _same(form_token, request.cookies.get(SIGN_IN_COOKIE, "")):
        raise HTTPException(403, "the sign-in form's CSRF token is missing or wrong; reload the page and try again")


CsrfChecked = Annotated[UiPrincipal, Depends(csrf_checked)]
