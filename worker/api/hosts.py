"""The names the API answers to (REACTQ_API_ALLOWED_HOSTS): a request whose Host header names anything else
answers 400 before any route, /metrics, /healthz and the UI included (docs/decisions/exposure.md).

Why: a web page whose name an attacker re-points at 127.0.0.1 (DNS rebinding) makes the browser send
`Host: attacker.example` to a loopback API; with `--insecure-no-auth`, or for /metrics, nothing else would
stop it. Starlette's TrustedHostMiddleware cuts the port at the first ':' (so `[::1]:8000` would never
match) and answers plain text; this one reads bracketed IPv6 hosts and answers the API's JSON error."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ..runtime.host_names import AllowedHosts


class HostGuard:
    """ASGI middleware: 400 unless the request's Host is one of `allowed`."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed.allows(Headers(scope=scope).get("host")):
            await self.app(scope, receive, send)
            return
        body = b'{"error": {"message": "unknown host: this server answers only to the names of ' \
               b'REACTQ_API_ALLOWED_HOSTS", "status": 400}}'
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
