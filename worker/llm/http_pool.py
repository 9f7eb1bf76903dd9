"""The HTTP client the openai client runs on: openai 3 builds on httpx2 (httpx's successor, with its own
httpcore2), and this is an httpx2 client that keeps no cookies, shares one TLS context per process and sends
its requests through urllib3 (worker/llm/http_transport.py).

httpcore 1.0.9's pool could close a connection under a request that had just taken it (encode/httpcore#1110:
it read an idle connection's state, then its socket, and a reply arriving in between made the socket
readable); reactq wrapped its connections to avoid that. httpcore2's pool skips the expiry check on a
connection a request holds, so the wrapper went with the move to openai 3; tests/test_llm.py's 200 calls on
8 one-connection pools would show the failure again (a call failing with EBADF or waiting out its timeout).
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
from typing import Any

import httpx2

from .http_transport import Urllib3Transport


class _NoCookies(httpx2.Cookies):
    """A cookie jar that keeps nothing. httpx parses every response for cookies by building a urllib
    request from the request's headers, which was ~30% of the CPU of a call through the SDK; and an LLM
    API needs no cookies, which on clients shared by every run and tenant of a worker would carry one
    caller's provider state (a load balancer's affinity, say) into another's calls."""

    def extract_cookies(self, response: httpx2.Response) -> None:
        return None


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """httpx2's default TLS context (verified, certifi's CAs or SSL_CERT_FILE), built once per process:
    building one reads the whole CA bundle (~17 ms of CPU), and every shard's client would build two."""
    return httpx2.create_ssl_context()


def _environment_proxy() -> bool:
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


class LLMHTTPClient(httpx2.Client):
    """An httpx2 client for the openai client: no cookies kept, one TLS context per process, urllib3 beneath.
    When the environment names an HTTP proxy (HTTP_PROXY, HTTPS_PROXY or ALL_PROXY), httpx2's own transport
    stays, with its proxy routing and NO_PROXY (httpx2 applies the environment's proxies only to its own)."""

    _no_cookies = _NoCookies()

    def __init__(self, limits: httpx2.Limits, timeout: float, **kwargs: Any) -> None:
        if "transport" not in kwargs and not _environment_proxy():
            kwargs["transport"] = Urllib3Transport(limits, shared_ssl_context())
        super().__init__(verify=shared_ssl_context(), limits=limits, timeout=timeout, **kwargs)

    @property  # type: ignore[override, misc]  # read-only here: nothing sets it
    def cookies(self) -> httpx2.Cookies:
        return self._no_cookies
