"""The httpx client the openai client runs on: it keeps no cookies, and its connection pool cannot close
a connection under a request that has just taken it.

httpcore 1.0.9's pool (encode/httpcore#1110) decides that an idle connection whose socket is readable
was closed by the server, by checking the connection's state and then its socket. A thread that takes
the connection in between, sends its request and already has its reply waiting makes that socket
readable, and the pool closes the connection under it: the request fails with EBADF, or its read waits
out the whole timeout. With 40 threads on 8 one-connection pools against a local stub that was about
one call in a thousand (17 in 16,000); with the connection counted as expired only if it is still idle
once its socket was looked at, none in 16,000.
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
from typing import Any

import httpcore
import httpx


class _NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing. httpx parses every response for cookies by building a urllib
    request from the request's headers, which was ~30% of the CPU of a call through the SDK; and an LLM
    API needs no cookies, which on clients shared by every run and tenant of a worker would carry one
    caller's provider state (a load balancer's affinity, say) into another's calls."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _Connection(httpcore.ConnectionInterface):
    """A pooled connection that counts as expired only if it is still idle after the check."""

    def __init__(self, inner: httpcore.ConnectionInterface) -> None:
        self._inner = inner

    def has_expired(self) -> bool:
        return self._inner.has_expired() and self._inner.is_idle()

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()

    def info(self) -> str:
        return self._inner.info()

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return self._inner.can_handle_request(origin)

    def is_available(self) -> bool:
        return self._inner.is_available()

    def is_idle(self) -> bool:
        return self._inner.is_idle()

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def __repr__(self) -> str:
        return repr(self._inner)


class _Pool(httpcore.ConnectionPool):
    def create_connection(self, origin: httpcore.Origin) -> httpcore.ConnectionInterface:
        return _Connection(super().create_connection(origin))


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context (verified, certifi's CAs or SSL_CERT_FILE), built once per process:
    building one reads the whole CA bundle (~17 ms of CPU), and every shard's client would build two."""
    return httpx.create_ssl_context()


class _Transport(httpx.HTTPTransport):
    """httpx's transport over `_Pool`, with httpx's defaults (TLS verified, HTTP/1.1)."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(verify=shared_ssl_context(), limits=limits)
        self._pool = _Pool(ssl_context=shared_ssl_context(), max_connections=limits.max_connections,
                           max_keepalive_connections=limits.max_keepalive_connections,
                           keepalive_expiry=limits.keepalive_expiry)


class LLMHTTPClient(httpx.Client):
    """An httpx client for the openai client: no cookies kept, one TLS context per process, and the pool
    above unless an environment proxy (HTTP_PROXY and the like) applies, which httpx's own transport
    honours."""

    _no_cookies = _NoCookies()

    def __init__(self, limits: httpx.Limits, timeout: float, **kwargs: Any) -> None:
        proxied = bool(urllib.request.getproxies())
        super().__init__(verify=shared_ssl_context(), limits=limits, timeout=timeout,
                         transport=None if proxied else _Transport(limits), **kwargs)

    @property  # type: ignore[override, misc]  # read-only here: nothing sets it
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies
