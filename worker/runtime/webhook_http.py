"""One webhook POST over HTTP that costs at most its deadline and reads at most a small part of the answer.

A per-read timeout does not bound an attempt: a receiver that answers 200 and then sends a byte every few
seconds (or trickles its headers, or reads the request slowly) would hold the delivering thread for hours.
So every wait of an attempt (the name lookup, connect, TLS handshake, each write and each read) ends by
one deadline fixed when the attempt starts: the lookup is waited for until then (worker/runtime/webhook_dns.py);
an httpcore network backend clamps each socket operation's timeout to the time left, and an operation
starting past the deadline times out at once. The answer's body is read up to `max_response_bytes`
(raw bytes, never decompressed), then the connection is closed: a receiver streaming gigabytes costs one
read buffer. The status decides the attempt; the body is not kept.

httpcore is used directly (rather than through httpx) because it takes a network backend; no connection
is kept alive (requests go to checked IP addresses, worker/runtime/webhooks.py: a pooled TLS connection,
keyed by address only, could carry a request for another host name than it verified).
"""

from __future__ import annotations

import ssl
import time
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

import httpcore
import httpx

from ..core.deliveries import AttemptError

WRITE_CHUNK = 16 * 1024  # a slow-reading receiver is checked against the deadline between pieces


@lru_cache(maxsize=1)
def default_tls() -> ssl.SSLContext:
    """The certificate checks httpx makes by default (certifi's roots), built once per process."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class WebhookHTTP:
    """How attempts are made: the total deadline of one attempt, the cap on the answer's body, and the TLS
    context that verifies receivers (None: `default_tls()`)."""

    deadline_s: float = 10.0
    max_response_bytes: int = 64 * 1024
    tls: ssl.SSLContext | None = field(default=None, compare=False)


@dataclass
class Answer:
    """How one attempt went: the status if the receiver answered, the bytes of its body read (at most the
    cap plus one read), and, when it did not deliver for a reason other than its status, why."""

    status_code: int | None = None
    address: str | None = None
    body_bytes: int = 0
    kind: AttemptError | None = None
    error: str | None = None


class _Deadline:
    def __init__(self, seconds: float, start: float | None = None) -> None:
        self.seconds = seconds
        self.at = (time.monotonic() if start is None else start) + seconds

    def left(self, timeout: float | None, late: type[Exception]) -> float:
        """The timeout to give the next socket operation; raises `late` once the deadline has passed."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("the attempt's deadline has passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_CHUNK):
            self._inner.write(buffer[start:start + WRITE_CHUNK], self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      self._deadline.left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, deadline: _Deadline) -> None:
        self._inner, self._deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self._deadline.left(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def pinned_url(url: str, address: str) -> str:
    """`url` with its host replaced by `address` (the request's Host header and TLS name keep the host)."""
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _timed_out(deadline: _Deadline, exc: Exception, status: int | None) -> str:
    limit = f"within the {deadline.seconds:g} s deadline"
    if status is not None:
        return f"HTTP {status}, but the body did not end {limit}"
    if isinstance(exc, httpcore.ConnectTimeout):
        return f"could not connect {limit}"
    if isinstance(exc, httpcore.WriteTimeout):
        return f"the receiver did not take the request {limit}"
    return f"no answer {limit}"


def _post_one(http: WebhookHTTP, deadline: _Deadline, url: str, address: str, body: bytes,
              headers: dict[str, str]) -> Answer:
    """One try at `address`; httpcore.ConnectError (nothing was sent) is left to the caller."""
    parts = urlsplit(url)
    sent = {**headers, "Host": parts.netloc, "Content-Length": str(len(body))}
    timeouts = dict.fromkeys(("connect", "read", "write", "pool"), deadline.seconds)
    answer = Answer(address=address)
    with httpcore.ConnectionPool(ssl_context=http.tls or default_tls(), max_connections=1,
                                 max_keepalive_connections=0, network_backend=_DeadlineBackend(deadline)) as pool:
        try:
            with pool.stream("POST", pinned_url(url, address), headers=list(sent.items()), content=body,
                             extensions={"timeout": timeouts, "sni_hostname": parts.hostname or ""}) as response:
                answer.status_code = response.status
                chunks = response.iter_stream() if http.max_response_bytes > 0 else iter(())
                for chunk in chunks:
                    answer.body_bytes += len(chunk)
                    if answer.body_bytes >= http.max_response_bytes:
                        break  # leaving the block closes the connection (nothing is kept alive)
        except httpcore.TimeoutException as exc:
            answer.kind, answer.error = AttemptError.TIMEOUT, _timed_out(deadline, exc, answer.status_code)
        except httpcore.ConnectError:
            raise
        except httpcore.NetworkError:
            answer.kind, answer.error = AttemptError.CONNECTION_FAILED, "the connection broke"
        except httpcore.ProtocolError:
            answer.kind, answer.error = AttemptError.PROTOCOL_ERROR, "the answer was not valid HTTP"
    return answer


def post(http: WebhookHTTP, url: str, addresses: list[str], body: bytes, headers: dict[str, str],
         start: float | None = None) -> Answer:
    """POST to the first of the checked addresses that takes the connection, all within one deadline
    counted from `start` (time.monotonic(); default now). Never raises: a failure is the Answer's `kind`
    and `error`."""
    deadline = _Deadline(http.deadline_s, start)
    last: str | None = None
    for address in addresses:
        try:
            return _post_one(http, deadline, url, address, body, headers)
        except httpcore.ConnectError:
            last = address
    return Answer(address=last, kind=AttemptError.CONNECTION_FAILED, error="could not connect")
