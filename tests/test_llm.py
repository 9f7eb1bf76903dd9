"""The LLM edge's reading of a chat completion body: validated into our reply shape, never trusted."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fixtures_stub import StubControl
from worker.core.models import ToolCall, Usage
from worker.errors import LLMError
from worker.llm.client import OpenAIChat, parse_completion


def body(message: dict, **extra: object) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m", "created": 1,
                       "choices": [{"index": 0, "message": {"role": "assistant", **message},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}, **extra})


def test_a_text_reply() -> None:
    reply = parse_completion(body({"content": "42"}), attempts=2, duration_ms=5)
    assert (reply.content, reply.tool_calls, reply.model, reply.finish_reason) == ("42", [], "m", "stop")
    assert reply.usage == Usage(prompt_tokens=7, completion_tokens=3)
    assert (reply.attempts, reply.duration_ms) == (2, 5)


def test_tool_calls_keep_their_raw_arguments_and_get_ids_when_missing() -> None:
    reply = parse_completion(body({"content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}},
        {"type": "function", "function": {"name": "search", "arguments": "not json"}},
    ]}))
    assert reply.tool_calls == [ToolCall(id="a", name="calculator", arguments='{"expression": "1+1"}'),
                                ToolCall(id="call-1", name="search", arguments="not json")]


def test_no_choices_is_an_empty_reply_and_missing_usage_counts_zero() -> None:
    reply = parse_completion(json.dumps({"model": "m", "choices": []}))
    assert reply.content is None and reply.finish_reason == "empty" and reply.usage == Usage()


@pytest.mark.parametrize("raw", ["not json", json.dumps({"choices": [{"message": "hi"}]}),
                                 json.dumps({"choices": [{"message": {"content": 5}}]})])
def test_a_malformed_body_is_a_clear_llm_error(raw: str) -> None:
    with pytest.raises(LLMError, match="malformed completion"):
        parse_completion(raw)


# --- OpenAIChat against the real stub over HTTP ----------------------------------------------------
MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]


def chat_client(base_url: str, **kwargs: Any) -> OpenAIChat:
    """A client of the test's stub; its timeout is long, since a timed-out attempt is retried and would make
    the stub's counts differ from what a test expects whenever a loaded machine holds a request up."""
    return OpenAIChat(base_url, "sk-test", backoff_base_s=0.01, **{"timeout_s": 120.0, **kwargs})


def test_a_failed_first_attempt_is_retried_and_counted(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(fail_first_n=2, fail_status=503)
    seen: list[str] = []
    client = chat_client(stub_base_url, on_attempt=lambda model, outcome, s: seen.append(outcome))
    reply = client.chat(MESSAGES, model="m")
    assert reply.attempts == 3 and reply.content
    assert seen == ["server_error", "server_error", "ok"]
    assert stub_control.stats()["by_status"] == {"503": 2, "200": 1}


def test_retries_stop_at_max_retries_with_the_count_in_the_error(stub_base_url: str,
                                                                 stub_control: StubControl) -> None:
    stub_control.set_faults(fail_first_n=10, fail_status=500)
    with pytest.raises(LLMError) as failed:
        chat_client(stub_base_url, max_retries=2).chat(MESSAGES, model="m")
    assert failed.value.attempts == 3 and "3 attempt(s)" in str(failed.value) and "500" in str(failed.value)
    assert stub_control.stats()["by_status"] == {"500": 3}


def test_a_client_error_is_not_retried(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(fail_first_n=5, fail_status=400)
    with pytest.raises(LLMError) as failed:
        chat_client(stub_base_url).chat(MESSAGES, model="m")
    assert failed.value.attempts == 1
    assert stub_control.stats()["by_status"] == {"400": 1}


def test_a_429_reports_its_retry_after_to_the_shared_cool_down(stub_base_url: str,
                                                                stub_control: StubControl) -> None:
    stub_control.set_faults(fail_first_n=0, error_rate_429=1.0, retry_after_s=0.05)
    hints: list[tuple[str, float | None]] = []
    with pytest.raises(LLMError):
        chat_client(stub_base_url, max_retries=1, on_rate_limited=lambda m, s: hints.append((m, s))).chat(
            MESSAGES, model="m")
    assert hints == [("m", 0.05), ("m", 0.05)]


def test_threads_share_a_bounded_number_of_clients(stub_base_url: str, stub_control: StubControl) -> None:
    attempts: list[str] = []
    client = chat_client(stub_base_url, max_connections=8, timeout_s=20.0, max_retries=0,
                         on_attempt=lambda model, outcome, seconds: attempts.append(outcome))
    with ThreadPoolExecutor(max_workers=40) as pool:
        replies = list(pool.map(lambda _: client.chat(MESSAGES, model="m"), range(200)))
    assert all(r.content for r in replies)
    built = [c for c in client._shards if c is not None]
    assert len(client._shards) == 8 and 1 <= len(built) <= 8  # min(POOL_SHARDS, max_connections)
    # One attempt per call: none failed with EBADF or waited out its timeout (worker/llm/http_pool.py).
    assert attempts == ["ok"] * 200
    assert stub_control.stats()["by_status"] == {"200": 200}
    client.close()
    assert client._shards == [None] * 8
    assert client.chat(MESSAGES, model="m").content  # a closed client builds its shard again


def json_provider(status: int, payload: str, headers: dict[str, str] | None = None,
                  cookies: list[str | None] | None = None) -> ThreadingHTTPServer:
    """A provider on a free port that answers every POST with `status` and the JSON `payload` (and
    `headers`), noting each request's Cookie header in `cookies`. The caller shuts it down."""

    class Provider(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            if cookies is not None:
                cookies.append(self.headers.get("Cookie"))
            reply = payload.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_providers_cookies_are_not_sent_back() -> None:
    """The clients are shared by every run and tenant of a worker: a cookie one reply sets (a load
    balancer's affinity, say) must not ride along on the next caller's request."""
    seen: list[str | None] = []
    server = json_provider(200, body({"content": "ok"}), {"Set-Cookie": "affinity=tenant-a; Path=/"}, seen)
    try:
        client = chat_client(f"http://127.0.0.1:{server.server_port}/v1", max_connections=1)
        assert [client.chat(MESSAGES, model="m").content for _ in range(2)] == ["ok", "ok"]
        assert seen == [None, None]
        client.close()
    finally:
        server.shutdown()
        server.server_close()

