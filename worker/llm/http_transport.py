"""The openai client's requests, sent through urllib3 instead of httpx2's default transport (httpcore2 and h11).

A streamed answer arrives as one HTTP chunk per token from vLLM, llama-server or Ollama, and httpcore2's pure
Python HTTP/1.1 parser (h11) spends 17-22 us of CPU on each; urllib3 reads them through http.client's C
buffering for 10-14 us, which on a 300-token answer is a third of the call's client CPU (BENCHMARKS.md, twelfth
session). httpx2 and the openai client stay on top: requests, retries, errors and the response are theirs; this
transport only moves the bytes, and raises httpx2's own exceptions, so the openai client maps them to
APITimeoutError and APIConnectionError as before.

Pool: one urllib3 pool per host with at most `limits.max_connections` connections; a request that finds them
all busy waits up to its pool timeout (httpx2.PoolTimeout). A kept-alive connection the server has closed is
found dropped when taken, and a new one is opened. HTTP proxies are not handled here: LLMHTTPClient keeps
httpx2's own transport when the environment names one (worker/llm/http_pool.py).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx2
import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    EmptyPoolError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

READ_SIZE = 65536  # at most this much of a body that is not chunked per read (a read returns what has arrived)


def _request_error(exc: BaseException, request: httpx2.Request) -> httpx2.TransportError:
    """The httpx2 exception for a urllib3 error raised before the response's headers were read. A connection
    that was never made is a ConnectError or ConnectTimeout: the provider saw nothing (worker/llm/client.py
    counts no tokens for it)."""
    if isinstance(exc, EmptyPoolError):
        return httpx2.PoolTimeout("no connection to the model's server came free in time", request=request)
    if isinstance(exc, (NewConnectionError, SSLError)):  # NewConnectionError is also a ConnectTimeoutError
        return httpx2.ConnectError("could not connect to the model's server", request=request)
    if isinstance(exc, ConnectTimeoutError):
        return httpx2.ConnectTimeout("connecting to the model's server timed out", request=request)
    if isinstance(exc, ReadTimeoutError):
        return httpx2.ReadTimeout("the model's server did not answer in time", request=request)
    return httpx2.RemoteProtocolError("the model's server closed the connection", request=request)


class _Body(httpx2.SyncByteStream):
    """A response's body as it arrives: each HTTP chunk when chunked, else what each read returns."""

    def __init__(self, response: urllib3.BaseHTTPResponse, request: httpx2.Request) -> None:
        self.response = response
        self.request = request
        self.finished = False

    def __iter__(self) -> Iterator[bytes]:
        response = self.response
        try:
            if response.chunked:
                yield from response.read_chunked(decode_content=False)
            else:
                while data := response.read1(READ_SIZE, decode_content=False):
                    yield data
        except ReadTimeoutError as exc:
            raise httpx2.ReadTimeout("the model's server went silent", request=self.request) from exc
        except ProtocolError as exc:
            raise httpx2.RemoteProtocolError("the model's server closed the connection mid-answer",
                                             request=self.request) from exc
        except (HTTPError, OSError) as exc:
            raise httpx2.ReadError("reading the model's answer failed", request=self.request) from exc
        self.finished = True

    def close(self) -> None:
        """Back to the pool when the body was read to its end; a connection left mid-body is closed instead
        (its unread bytes would be the next request's answer)."""
        if not self.finished:
            self.response.close()
        self.response.release_conn()


class Urllib3Transport(httpx2.BaseTransport):
    """An httpx2 transport over a urllib3 PoolManager. Each origin's pool is looked up once and kept: the
    manager's own lookup builds and normalises a key from every request's URL. An openai client talks to one
    origin (its base URL; redirects are not followed), well within the four the manager keeps open."""

    def __init__(self, limits: httpx2.Limits, ssl_context: ssl.SSLContext) -> None:
        self._pools = urllib3.PoolManager(num_pools=4, maxsize=limits.max_connections or 10, block=True,
                                          ssl_context=ssl_context)
        self._by_origin: dict[tuple[str, str, int | None], urllib3.HTTPConnectionPool] = {}

    def _pool(self, url: httpx2.URL) -> urllib3.HTTPConnectionPool:
        origin = (url.scheme, url.host, url.port)
        pool = self._by_origin.get(origin)
        if pool is None:
            pool = self._by_origin[origin] = self._pools.connection_from_host(url.host, url.port, url.scheme)
        return pool

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts = request.extensions.get("timeout", {})
        headers = urllib3.HTTPHeaderDict()
        for name, value in request.headers.raw:
            headers.add(name.decode("latin-1"), value.decode("latin-1"))
        try:
            response = self._pool(request.url).urlopen(
                request.method, request.url.raw_path.decode("ascii"), body=request.read(), headers=headers,
                timeout=urllib3.Timeout(connect=timeouts.get("connect"), read=timeouts.get("read")),
                pool_timeout=timeouts.get("pool"), retries=False, redirect=False, assert_same_host=False,
                preload_content=False, decode_content=False)
        except (HTTPError, OSError) as exc:
            raise _request_error(exc, request) from exc
        return httpx2.Response(response.status, headers=list(response.headers.iteritems()),
                               stream=_Body(response, request),
                               extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason.encode()
                                           if response.reason else b""})

    def close(self) -> None:
        self._by_origin.clear()
        self._pools.clear()
