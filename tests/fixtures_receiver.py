"""A local webhook receiver for tests: a real HTTP server in a thread that answers its first `fail_first`
calls with 500 (or every call, with fail_first=-1) and records each request. With `judge`, the status
of each call is what `judge(headers, body)` says (e.g. 401 for a signature that does not verify)."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.waiting import wait_for


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    fail_first: int = 0
    judge: Callable[[dict[str, str], bytes], int] | None = None
    tls: ssl.SSLContext | None = None  # serve https with this server context
    calls: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                failing = receiver.fail_first < 0 or len(receiver.calls) < receiver.fail_first
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = 500 if failing else receiver.judge(headers, body) if receiver.judge else 200
                receiver.calls.append(Received(self.path, headers, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def wait_for(self, what: str, ok: Callable[[list[Received]], bool], timeout: float = 120) -> list[Received]:
        """The calls received so far, once `ok` of them holds; a timeout shows how each call was answered."""
        return wait_for(f"the receiver to get {what}", lambda: list(self.calls), timeout, until=ok,
                        show=lambda calls: [c.answered for c in calls])


@pytest.fixture
def make_receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def make(fail_first: int = 0, judge: Callable[[dict[str, str], bytes], int] | None = None,
             tls: ssl.SSLContext | None = None) -> Receiver:
        receiver = Receiver(fail_first, judge, tls).start()
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()
