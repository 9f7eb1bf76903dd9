"""Streamed completions: the chunks folded back into the reply they make up (pure), and, over real HTTP against
the stub, a slow model that writes for longer than the timeout is not cut off while it keeps writing, a silent
one is, a timed-out request is sent twice at most, and the tokens of attempts cut mid-answer are counted."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fixtures_stub import StubControl
from worker.core.models import ToolCall
from worker.errors import LLMError
from worker.llm.client import OpenAIChat, parse_completion
from worker.llm.stream import MAX_STREAMED_CHARS, StreamedCompletion

MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def fold(*chunks: Any) -> StreamedCompletion:
    folded = StreamedCompletion()
    for c in chunks:
        folded.add(c)
    return folded


def test_text_pieces_finish_reason_and_the_usage_chunk_make_one_reply() -> None:
    folded = fold(chunk({"role": "assistant", "content": ""}), chunk({"content": "Final "}),
                  chunk({"content": "Answer: 42"}), chunk({}, "stop"),
                  {"model": "m", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
    reply = parse_completion(folded.body())
    assert (reply.content, reply.finish_reason, reply.model) == ("Final Answer: 42", "stop", "m")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (9, 4)


def test_tool_calls_are_put_together_by_their_index() -> None:
    folded = fold(
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "calculator", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "search", "arguments": '{"q'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"expression": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"6*7"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '": "x"}'}}]}),
        chunk({}, "tool_calls"))
    reply = parse_completion(folded.body())
    assert reply.content is None and reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [ToolCall(id="a", name="calculator", arguments='{"expression": "6*7"}'),
                                ToolCall(id="b", name="search", arguments='{"q": "x"}')]


def test_reasoning_is_kept_apart_from_the_content() -> None:
    body = fold(chunk({"reasoning_content": "6*7 is "}), chunk({"reasoning_content": "42"}),
                chunk({"content": "42"}, "stop")).body()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "42", "reasoning_content": "6*7 is 42"}


@pytest.mark.parametrize("junk", [None, "text", 7, [], {"choices": "x"}, {"choices": [None]},
                                  {"choices": [{"delta": "x"}]}, {"choices": [{"delta": {"content": 5}}]},
                                  {"choices": [{"delta": {"tool_calls": [None, {"function": "f"}]}}]},
                                  {"usage": "lots"}])
def test_chunks_of_the_wrong_shape_are_ignored(junk: Any) -> None:
    reply = parse_completion(fold(chunk({"content": "ok"}), junk, chunk({}, "stop")).body())
    assert (reply.content, reply.finish_reason) == ("ok", "stop")


def test_a_stream_longer_than_any_reply_is_refused() -> None:
    folded = StreamedCompletion()
    with pytest.raises(LLMError, match="streamed more than"):
        for _ in range(MAX_STREAMED_CHARS // 1000 + 2):
            folded.add(chunk({"content": "x" * 1000}))


def client(base_url: str, **kwargs: Any) -> OpenAIChat:
    return OpenAIChat(base_url, "sk-test", **{"backoff_base_s": 0.01, **kwargs})


def test_a_streamed_reply_is_the_reply_the_server_would_send_whole(stub_base_url: str,
                                                                   stub_control: StubControl) -> None:
    streamed = client(stub_base_url).chat(MESSAGES, model="m")
    whole = client(stub_base_url, stream=False).chat(MESSAGES, model="m")
    assert streamed.content and streamed.content == whole.content
    assert streamed.usage == whole.usage and streamed.usage.prompt_tokens > 0
    assert (streamed.finish_reason, streamed.lost_usage.total) == (whole.finish_reason, 0)


def test_a_slow_model_that_keeps_writing_is_not_cut_off_and_a_silent_one_is_asked_twice_at_most(
        stub_base_url: str, stub_control: StubControl) -> None:
    """Each chunk comes 0.4 s after the one before, so the answer takes seconds; the timeout is 1.5 s of
    silence. Streamed, one request gets the answer. Not streamed, the server is silent until it has written
    it all: the request times out, is sent once more, and the call fails, its two attempts counted."""
    stub_control.set_faults(chunk_delay_ms=400)
    started = time.monotonic()
    reply = client(stub_base_url, timeout_s=1.5).chat(MESSAGES, model="m")
    assert reply.content and reply.attempts == 1 and time.monotonic() - started > 1.5
    assert stub_control.stats()["requests"] == 1

    stub_control.reset()
    stub_control.set_faults(chunk_delay_ms=400)
    with pytest.raises(LLMError) as failed:
        client(stub_base_url, timeout_s=1.5, stream=False, max_retries=4).chat(MESSAGES, model="m")
    assert failed.value.outcome == "timeout" and failed.value.attempts == 2, str(failed.value)
    assert stub_control.stats()["requests"] == 2  # not five: a slow model asked again is only slower
    lost = failed.value.lost_usage
    assert lost is not None and lost.estimated and lost.prompt_tokens > 0  # read twice, maybe billed


def test_the_run_deadline_cuts_a_streamed_answer_that_would_outlast_it(stub_base_url: str,
                                                                      stub_control: StubControl) -> None:
    stub_control.set_faults(chunk_delay_ms=300)
    started = time.time()
    with pytest.raises(LLMError) as failed:
        client(stub_base_url, timeout_s=30, max_retries=0).chat(MESSAGES, model="m", deadline_at=started + 1.0)
    assert failed.value.outcome == "timeout"
    assert time.time() - started < 1.0 + 0.3 + 2.0  # cut at the first chunk past the deadline, not at its end
    lost = failed.value.lost_usage
    assert lost is not None and lost.estimated and lost.completion_tokens > 0  # part of an answer was written


def test_a_server_that_answers_whole_when_asked_to_stream_is_read_whole(stub_base_url: str,
                                                                       stub_control: StubControl) -> None:
    """Some servers ignore `stream`: their JSON completion is the reply, not an empty stream."""

    class WholeAnswers(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            reply = json.dumps({"model": "m", "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "whole"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), WholeAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reply = client(f"http://127.0.0.1:{server.server_port}/v1").chat(MESSAGES, model="m")
    finally:
        server.shutdown()
    assert (reply.content, reply.usage.completion_tokens) == ("whole", 1)


def test_a_whole_answer_that_never_comes_is_a_timeout_like_any(stub_base_url: str, stub_control: StubControl) -> None:
    """The stub's dropped request sends its headers (JSON, not a stream) and then nothing: reading the body
    times out, and that is the client's timeout error, not an exception from inside httpx."""
    stub_control.set_faults(timeout_rate=1.0, timeout_s=30)
    with pytest.raises(LLMError) as failed:
        client(stub_base_url, timeout_s=0.5, max_retries=0).chat(MESSAGES, model="m")
    assert failed.value.outcome == "timeout" and "APITimeoutError" in str(failed.value)


class _SSE(BaseHTTPRequestHandler):
    """A provider that streams the events of `EVENTS` (each line as given), then closes."""

    EVENTS: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in self.EVENTS:
            self.wfile.write(f"{event}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def _sse_client(events: list[str]) -> tuple[OpenAIChat, ThreadingHTTPServer]:
    handler = type("Handler", (_SSE,), {"EVENTS": events})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return client(f"http://127.0.0.1:{server.server_port}/v1", max_retries=0), server


def test_comments_garbage_lines_and_event_names_between_chunks_are_skipped() -> None:
    events = [": keep-alive", "event: message", 'data: {"choices": [{"delta": {"content": "4"}}]}', "data: {oops",
              'data: {"choices": [{"delta": {"content": "2"}, "finish_reason": "stop"}]}',
              'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}', "data: [DONE]"]
    chat, server = _sse_client(events)
    try:
        reply = chat.chat(MESSAGES, model="m")
    finally:
        server.shutdown()
    assert (reply.content, reply.finish_reason, reply.usage.completion_tokens) == ("42", "stop", 2)


def test_an_error_event_mid_answer_is_a_server_error_to_try_again_later() -> None:
    chat, server = _sse_client(['data: {"choices": [{"delta": {"content": "4"}}]}',
                                'data: {"error": {"message": "overloaded: secret internals", "type": "server_error"}}'])
    try:
        with pytest.raises(LLMError) as failed:
            chat.chat(MESSAGES, model="m")
    finally:
        server.shutdown()
    assert failed.value.outcome == "server_error" and "secret" not in str(failed.value)


def test_a_server_that_is_down_is_tried_twice_and_the_step_is_left_to_wait() -> None:
    """Connection refused: one more try (a reset keep-alive connection is common), then the error, so the step
    goes back to the queue instead of holding its thread through four backoffs."""
    seen: list[str] = []
    chat = client("http://127.0.0.1:9/v1", max_retries=4, on_attempt=lambda m, outcome, s: seen.append(outcome))
    started = time.monotonic()
    with pytest.raises(LLMError) as failed:
        chat.chat(MESSAGES, model="m")
    assert failed.value.outcome == "connection_error" and failed.value.attempts == 2, str(failed.value)
    assert seen == ["connection_error", "connection_error"] and time.monotonic() - started < 5
    assert failed.value.lost_usage is not None and failed.value.lost_usage.total == 0  # never sent: never billed


def test_a_deadline_reached_between_tries_keeps_the_failure_that_was_the_reason(stub_base_url: str,
                                                                                 stub_control: StubControl) -> None:
    stub_control.set_faults(fail_first_n=10, fail_status=503)
    with pytest.raises(LLMError) as failed:
        client(stub_base_url, backoff_base_s=5.0, max_retries=4).chat(MESSAGES, model="m",
                                                                      deadline_at=time.time() + 1.0)
    assert failed.value.attempts == 1 and "HTTP 503" in str(failed.value), str(failed.value)
    assert stub_control.stats()["requests"] == 1  # the backoff reached the deadline: nothing more was sent


class _KeptAlive(BaseHTTPRequestHandler):
    """An HTTP/1.1 provider that streams a short answer in a chunked body and keeps the connection for the
    next request, as OpenAI, vLLM and llama.cpp do; `HOLD_S` > 0: it sends [DONE] and then holds the body
    open that long before ending it. Counts the connections it accepted."""

    protocol_version = "HTTP/1.1"
    HOLD_S = 0.0
    connections: list[int] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in ('data: {"choices": [{"delta": {"content": "42"}, "finish_reason": "stop"}]}',
                      'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}', "data: [DONE]"):
            data = f"{event}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        time.sleep(self.HOLD_S)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


def _kept_alive_server(hold_s: float = 0.0) -> tuple[ThreadingHTTPServer, list[int]]:
    connections: list[int] = []
    handler = type("Handler", (_KeptAlive,), {"HOLD_S": hold_s, "connections": connections})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, connections


def test_streamed_calls_reuse_one_connection() -> None:
    """The stream is read to the body's end, past [DONE]: a connection closed mid-body is not reused, and a
    new one per call is a TCP (and TLS) handshake per step."""
    server, connections = _kept_alive_server()
    try:
        chat = client(f"http://127.0.0.1:{server.server_port}/v1", max_retries=0)
        replies = [chat.chat(MESSAGES, model="m") for _ in range(3)]
    finally:
        server.shutdown()
    assert [r.content for r in replies] == ["42"] * 3 and len(connections) == 1


def test_an_answer_whose_body_does_not_end_after_done_is_still_the_answer() -> None:
    server, _ = _kept_alive_server(hold_s=2.0)
    try:
        reply = client(f"http://127.0.0.1:{server.server_port}/v1", timeout_s=0.3, max_retries=0).chat(
            MESSAGES, model="m")
    finally:
        server.shutdown()
    assert (reply.content, reply.usage.completion_tokens, reply.lost_usage.total) == ("42", 1, 0)
