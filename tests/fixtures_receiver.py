"""A local webhook receiver for tests: a real HTTP server in a thread that answers its first `fail_first`
calls with 500 (or every call, with fail_first=-1) and records each request. With `judge`, the status
of each call is what `judge(headers, body)` says (e.g. 401 for a signature that does not verify).

Hostile receivers (`behaviour`): `drip` answers 200 and then sends one byte of its body every `drip_s`
forever; `trickle` sends a status line and then one header a byte every `drip_s`, never ending it;
`huge` answers 200 and streams a body of a terabyte as fast as the client takes it; `hang` reads the
request and never answers. Each records the bytes of body it managed to send (`sent`) and whether the
client closed the connection (`client_closed`); they stop when the client goes away or the receiver stops."""

from __future__ import annotations

import select
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
    answered: int  # the status sent (0: none, for `hang`)
    sent: int = 0  # bytes of the answer's body sent (into the socket)
    client_closed: bool = False  # the client closed the connection before the answer ended


HUGE_BODY = 1 << 40
CHUNK = b"x" * 65536


@dataclass
class Receiver:
    fail_first: int = 0
    judge: Callable[[dict[str, str], bytes], int] | None = None
    tls: ssl.SSLContext | None = None  # serve https with this server context
    behaviour: str = "answer"  # or drip, trickle, huge, hang (the module's docstring)
    drip_s: float = 1.0
    calls: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

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
                headers = {k.lower(): v for k, v in self.headers.items()}
                if receiver.behaviour != "answer":
                    self.misbehave(Received(self.path, headers, body, 0 if receiver.behaviour == "hang" else 200))
                    return
                failing = receiver.fail_first < 0 or len(receiver.calls) < receiver.fail_first
                status = 500 if failing else receiver.judge(headers, body) if receiver.judge else 200
                receiver.calls.append(Received(self.path, headers, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def misbehave(self, call: Received) -> None:
                receiver.calls.append(call)
                if receiver.behaviour == "hang":  # until the client closes (its socket reads as EOF)
                    while not receiver.stopping.is_set():
                        if select.select([self.connection], [], [], 0.2)[0]:
                            call.client_closed = self.connection.recv(1) == b""
                            return
                    return
                if receiver.behaviour == "trickle":  # a status line, then one header's value a byte at a time
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    self.send_response(200)
                    self.send_header("content-length", str(HUGE_BODY))
                    self.end_headers()
                piece = CHUNK if receiver.behaviour == "huge" else b"a"
                try:
                    while not receiver.stopping.is_set():
                        self.wfile.write(piece)
                        self.wfile.flush()
                        call.sent += len(piece)
                        if receiver.behaviour != "huge":
                            receiver.stopping.wait(receiver.drip_s)
                except OSError:  # the client went away
                    call.client_closed = True
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
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
             tls: ssl.SSLContext | None = None, behaviour: str = "answer", drip_s: float = 1.0) -> Receiver:
        receiver = Receiver(fail_first, judge, tls, behaviour, drip_s).start()
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()
