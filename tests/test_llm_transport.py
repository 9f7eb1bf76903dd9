"""The model calls' HTTP transport (worker/llm/http_transport.py: urllib3 beneath httpx2 and the openai client),
over real HTTP and TLS servers: certificates are verified, an environment proxy is still used, the pool is
bounded, a connection the server closed is replaced, and an answer cut off mid-body leaves nothing behind."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fixtures_stub import StubControl
from worker.errors import LLMError
from worker.llm.client import OpenAIChat
from worker.llm.http_pool import LLMHTTPClient
from worker.llm.http_transport import Urllib3Transport

MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]
COMPLETION = {"id": "x", "object": "chat.completion", "model": "m", "created": 1,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}


class _Provider(BaseHTTPRequestHandler):
    """An HTTP/1.1 provider answering every POST with COMPLETION whole, after HOLD_S (BODY_S: the body comes
    that long after the headers); it notes each request line in `requests`, counts the connections it
    accepted and the most it held open at once, and closes a kept-alive connection after IDLE_S of silence."""

    protocol_version = "HTTP/1.1"
    HOLD_S = 0.0
    BODY_S = 0.0
    IDLE_S = 30.0
    requests: list[str] = []
    connections: list[int] = []
    open_now: list[int] = []
    most_open: list[int] = []

    def setup(self) -> None:
        self.timeout = self.IDLE_S
        super().setup()
        self.connections.append(1)
        self.open_now.append(1)
        self.most_open.append(len(self.open_now))

    def finish(self) -> None:
        super().finish()
        self.open_now.pop()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.requests.append(self.requestline)
        time.sleep(self.HOLD_S)
        reply = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.flush()
        time.sleep(self.BODY_S)
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def provider(tls: ssl.SSLContext | None = None, **attrs: Any) -> tuple[ThreadingHTTPServer, type[_Provider]]:
    handler = type("Handler", (_Provider,), {"requests": [], "connections": [], "open_now": [], "most_open": [],
                                             **attrs})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(tls: ssl.SSLContext | None = None, **attrs: Any) -> tuple[int, type[_Provider]]:
        server, handler = provider(tls, **attrs)
        servers.append(server)
        return server.server_port, handler

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def certificate(tmp_path: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    """A self-signed certificate for `name`, and a server context serving it."""
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return cert, server


def chat_client(base_url: str, **kwargs: Any) -> OpenAIChat:
    return OpenAIChat(base_url, "sk-test", backoff_base_s=0.01, **{"timeout_s": 30.0, "max_retries": 0, **kwargs})


def test_tls_is_verified_and_names_the_urls_host(serve: Any, tmp_path: Path) -> None:
    """A certificate nobody vouches for is refused before the request is sent; one the client trusts serves; a
    trusted certificate for another name is refused."""
    cert, server_tls = certificate(tmp_path, "localhost")
    port, handler = serve(server_tls)
    with pytest.raises(LLMError) as refused:
        chat_client(f"https://localhost:{port}/v1", stream=False).chat(MESSAGES, model="m")
    assert refused.value.outcome == "connection_error"
    assert refused.value.lost_usage is not None and refused.value.lost_usage.total == 0  # never sent
    assert handler.requests == []

    limits = httpx2.Limits(max_connections=1)
    trusting = ssl.create_default_context(cafile=str(cert))
    with LLMHTTPClient(limits, 30.0, transport=Urllib3Transport(limits, trusting)) as client:
        answer = client.post(f"https://localhost:{port}/v1/chat/completions", json={"model": "m"})
        assert answer.json()["choices"][0]["message"]["content"] == "42"
        other_cert, other_tls = certificate(tmp_path, "elsewhere.test")
        other_port, other_handler = serve(other_tls)
        trusting.load_verify_locations(cafile=str(other_cert))
        with pytest.raises(httpx2.ConnectError):
            client.post(f"https://localhost:{other_port}/v1/chat/completions", json={"model": "m"})
    assert len(handler.requests) == 1 and other_handler.requests == []


def test_the_clients_of_a_process_share_one_tls_context() -> None:
    """Building a TLS context reads the whole CA bundle; a worker builds a client per shard."""
    limits = httpx2.Limits(max_connections=2, max_keepalive_connections=2)
    clients = [LLMHTTPClient(limits, timeout=30.0) for _ in range(2)]
    try:
        contexts = [c._transport._pools.connection_pool_kw["ssl_context"] for c in clients]  # type: ignore[attr-defined]
        assert contexts[0] is contexts[1] and contexts[0].verify_mode == ssl.CERT_REQUIRED
        assert contexts[0].check_hostname
    finally:
        for c in clients:
            c.close()


def test_an_environment_proxy_is_still_used(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx2 applies HTTP_PROXY and the like only to its own transport: with one set, that transport stays."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY",
                 "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    limits = httpx2.Limits(max_connections=1)
    assert isinstance(LLMHTTPClient(limits, 1.0)._transport, Urllib3Transport)

    port, proxy = serve()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    reply = chat_client("http://model.invalid/v1", stream=False).chat(MESSAGES, model="m")
    assert reply.content == "42"
    assert proxy.requests == ["POST http://model.invalid/v1/chat/completions HTTP/1.1"]


def test_at_most_max_connections_are_open_and_a_request_waits_for_one(serve: Any) -> None:
    port, handler = serve(HOLD_S=0.2)
    limits = httpx2.Limits(max_connections=2, max_keepalive_connections=2)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with LLMHTTPClient(limits, 30.0) as client:
        threads = [threading.Thread(target=lambda: client.post(url, json={}).raise_for_status()) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(handler.requests) == 6 and max(handler.most_open) == 2 and len(handler.connections) == 2



def test_a_response_left_before_its_body_gives_up_its_connection_and_nothing_of_its_body(serve: Any) -> None:
    """While a response is held, its connection is taken (a request waiting for one times out); left with its
    body unread, it is closed, not handed to the next request, which would read that body as its answer."""
    port, handler = serve(BODY_S=0.5)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with LLMHTTPClient(httpx2.Limits(max_connections=1), 30.0) as client:
        with client.stream("POST", url, json={}) as held:
            assert held.status_code == 200
            with pytest.raises(httpx2.PoolTimeout):
                client.post(url, json={}, timeout=httpx2.Timeout(30.0, pool=0.2))
        assert client.post(url, json={}).json() == COMPLETION
    assert len(handler.connections) == 2


def test_a_kept_alive_connection_the_server_closed_is_replaced(serve: Any) -> None:
    port, handler = serve(IDLE_S=0.2)
    seen: list[str] = []
    chat = chat_client(f"http://127.0.0.1:{port}/v1", max_connections=1, stream=False,
                       on_attempt=lambda model, outcome, seconds: seen.append(outcome))
    assert chat.chat(MESSAGES, model="m").content == "42"
    time.sleep(0.6)  # the server has closed the idle connection
    assert chat.chat(MESSAGES, model="m").content == "42"
    assert seen == ["ok", "ok"] and len(handler.connections) == 2


def test_an_answer_cut_off_mid_body_leaves_nothing_for_the_next_call(stub_base_url: str,
                                                                    stub_control: StubControl) -> None:
    """The run's deadline cuts a slow stream; the connection it leaves mid-body must be closed, not taken by
    the next call, whose answer would be the rest of the first one's."""
    chat = chat_client(stub_base_url, max_connections=1, max_retries=1)
    stub_control.set_faults(chunk_delay_ms=1000)
    with pytest.raises(LLMError) as cut:
        chat.chat(MESSAGES, model="m", deadline_at=time.time() + 0.5)  # cut at the first chunk, a second in
    assert cut.value.outcome == "timeout"
    stub_control.set_faults(chunk_delay_ms=0)
    reply = chat.chat(MESSAGES, model="m")  # at once: the first answer's next chunk is a second away
    whole = chat_client(stub_base_url, stream=False).chat(MESSAGES, model="m").content
    assert whole and reply.content == whole and reply.attempts == 1
