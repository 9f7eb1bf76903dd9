"""A real model for the tests: llama.cpp's llama-server with a small instruct GGUF (tests/test_real_model.py).

scripts/test.sh builds the server (scripts/build-llama-server.sh) and fetches the checksum-verified model
(scripts/fetch-test-model.sh), both cached outside the repository, and exports their paths as
REACTQ_TEST_LLAMA_SERVER and REACTQ_TEST_GGUF. Without them these tests skip on a laptop and fail under
REACTQ_REQUIRE_DOCKER=1 (CI sets it): CI must never skip them.

- `LlamaServer`: one llama-server process on a port, restartable on the same port (the outage test).
- `UsageProxy`: a recording HTTP proxy in front of it: every chat completion's status, usage and message as
  the server answered it, so a test compares what reactq recorded with what the server served.
- `llama` (module scope): a started server; `llama_proxy` (module scope): a proxy in front of it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures_services import free_port
from tests.waiting import wait_for
from worker.llm.stream import StreamedCompletion

SERVER_ENV = "REACTQ_TEST_LLAMA_SERVER"
GGUF_ENV = "REACTQ_TEST_GGUF"
ALIAS = "smollm2-135m-instruct"  # the model name the server answers to (--alias), i.e. REACTQ_MODEL


def llama_paths() -> tuple[Path, Path]:
    """The llama-server binary and the GGUF from the environment; skip, or fail when REACTQ_REQUIRE_DOCKER=1."""
    server, gguf = os.environ.get(SERVER_ENV, ""), os.environ.get(GGUF_ENV, "")
    problems = [f"{name} is not set" for name, value in ((SERVER_ENV, server), (GGUF_ENV, gguf)) if not value]
    problems += [f"{name}={value} is not a file" for name, value in ((SERVER_ENV, server), (GGUF_ENV, gguf))
                 if value and not Path(value).is_file()]
    if problems:
        msg = ("; ".join(problems) + ": the real-model tests need `export REACTQ_TEST_LLAMA_SERVER=$(bash "
               "scripts/build-llama-server.sh) REACTQ_TEST_GGUF=$(bash scripts/fetch-test-model.sh)` "
               "(scripts/test.sh does it)")
        if os.environ.get("REACTQ_REQUIRE_DOCKER", "") == "1":
            pytest.fail(f"REACTQ_REQUIRE_DOCKER=1 but {msg}")
        pytest.skip(msg)
    return Path(server), Path(gguf)


class LlamaServer:
    """llama-server serving one GGUF under ALIAS on 127.0.0.1:port (OpenAI API under /v1, --metrics on)."""

    def __init__(self, binary: Path, gguf: Path, logdir: Path, port: int | None = None,
                 ctx: int = 8192, parallel: int = 2) -> None:
        self.binary, self.gguf, self.logdir = binary, gguf, logdir
        self.port = port or free_port()
        self.ctx, self.parallel = ctx, parallel
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def log_path(self) -> Path:
        return self.logdir / f"llama-server-{self.starts}.log"

    def start(self, timeout: float = 180) -> LlamaServer:
        self.starts += 1
        log = self.log_path.open("wb")
        # -t 1: on a busy 2-core machine one thread was much faster than two; -np 2: two requests at once,
        # each with ctx/2 tokens of context
        self.proc = subprocess.Popen(
            [str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
             "--jinja", "-c", str(self.ctx), "-np", str(self.parallel), "-t", "1", "--alias", ALIAS,
             "--metrics", "--no-webui"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; its log ends:\n"
                                   f"{self.log()[-3000:]}")
            return httpx.get(f"{self.root_url}/health", timeout=5).status_code == 200

        wait_for(f"llama-server on port {self.port} to load {self.gguf.name} (log: {self.log_path})", healthy,
                 timeout, 0.2, ignoring=(httpx.HTTPError,))
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a crash: the port refuses connections until start() again."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        # SIGKILL too: on SIGTERM llama-server has left requests in flight unanswered with their connections open
        self.kill()

    def metrics(self) -> dict[str, float]:
        """Its Prometheus counters and gauges (llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total, ...)."""
        text = httpx.get(f"{self.root_url}/metrics", timeout=10).raise_for_status().text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


@dataclass
class Served:
    """One chat completion as the server answered it."""

    status: int
    usage: dict[str, int] = field(default_factory=dict)
    message: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None


def _streamed_body(payload: bytes) -> dict[str, Any]:
    """A streamed completion (server-sent events, passed on whole) folded into the completion it makes up."""
    folded = StreamedCompletion()
    for line in payload.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            folded.add(json.loads(line[5:]))
    return folded.body()


class UsageProxy:
    """A plain HTTP proxy to an upstream OpenAI-compatible server, recording every chat completion it passes
    back, streamed or not (a streamed one is passed on whole, once the server has finished it)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.served: list[Served] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=3600)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection", "content-length", "accept-encoding")}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    payload = response.read()
                    status, reply_headers = response.status, response.getheaders()
                except OSError:
                    self.send_error(502)
                    return
                finally:
                    upstream.close()
                self.send_response(status)
                for name, value in reply_headers:
                    if name.lower() not in ("connection", "content-length", "transfer-encoding", "keep-alive"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                if self.path.rstrip("/").endswith("/chat/completions"):
                    proxy._record(status, payload)

            do_GET = do_POST = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _record(self, status: int, payload: bytes) -> None:
        try:
            body = _streamed_body(payload) if payload.lstrip().startswith(b"data:") else json.loads(payload)
        except ValueError:
            body = {}
        choice = (body.get("choices") or [{}])[0] if isinstance(body, dict) else {}
        served = Served(status=status, usage=dict(body.get("usage") or {}) if isinstance(body, dict) else {},
                        message=dict(choice.get("message") or {}), finish_reason=choice.get("finish_reason"))
        with self._lock:
            self.served.append(served)

    def start(self) -> UsageProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[Served]:
        with self._lock:
            return list(self.served)

    def tokens(self) -> tuple[int, int]:
        """Prompt and completion tokens of every completion answered 200 so far."""
        ok = [s for s in self.snapshot() if s.status == 200]
        return (sum(int(s.usage.get("prompt_tokens", 0)) for s in ok),
                sum(int(s.usage.get("completion_tokens", 0)) for s in ok))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-server with the test model, shared by a module's tests."""
    binary, gguf = llama_paths()
    server = LlamaServer(binary, gguf, tmp_path_factory.mktemp("llama"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llama_proxy(llama: LlamaServer) -> Iterator[UsageProxy]:
    proxy = UsageProxy(llama.port).start()
    yield proxy
    proxy.stop()
