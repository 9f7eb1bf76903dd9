"""What an LLM call costs the worker's client side, streamed and not, by the length of the answer.

    python bench/llm_stream_cpu.py [--tokens 10,100,400] [--calls 50] [--transports urllib3,httpx2]

Starts a minimal keep-alive HTTP/1.1 model server in a subprocess (this file with --serve): a POST gets
the completion of N one-token pieces, as one JSON body when not streamed, else as N+3 server-sent events
in a chunked body, each chunk written on its own (a model writing token by token). In this process,
reactq's OpenAIChat (the client every step uses) makes --calls calls of each kind after 20 to warm up;
its CPU per call (process time; best and median of 5 rounds) and, streamed, per chunk over the
non-streamed call. The server's CPU is not counted.

Per transport beneath the httpx2 client: `urllib3` (worker/llm/http_transport.py, what a worker uses) and
`httpx2` (httpx2's own, httpcore2 and h11: what a worker uses when the environment names an HTTP proxy). The
transports' rounds alternate, in turns, so that both see the same minutes of the machine; the last column is
the baseline's streamed call over urllib3's.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def completion_parts(tokens: int, stream: bool) -> list[bytes]:
    """The response's writes: headers and body (one write), or headers and one write per event."""
    base = {"id": "chatcmpl-bench", "created": 1, "model": "bench", "system_fingerprint": "fp"}
    usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": tokens + 10}
    if not stream:
        message = {"role": "assistant", "content": " tok" * tokens}
        body = json.dumps({**base, "object": "chat.completion", "usage": usage,
                           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        return [head + body]

    def event(payload: object) -> bytes:
        data = f"data: {json.dumps(payload)}\n\n".encode()
        return b"%x\r\n%s\r\n" % (len(data), data)

    def delta(content: dict[str, object], finish: str | None = None) -> bytes:
        return event({**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}]})

    return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            delta({"role": "assistant", "content": ""}), *[delta({"content": " tok"}) for _ in range(tokens)],
            delta({}, "stop"), event({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}),
            b"e\r\ndata: [DONE]\n\n\r\n", b"0\r\n\r\n"]


def serve(port: int, tokens: int) -> None:
    answers = {stream: completion_parts(tokens, stream) for stream in (False, True)}
    listener = socket.create_server(("127.0.0.1", port), backlog=128)

    def connection(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                if not (data := conn.recv(65536)):
                    return
                buffer += data
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(buffer) < length:
                buffer += conn.recv(65536)
            body, buffer = buffer[:length], buffer[length:]
            for part in answers[b'"stream": true' in body or b'"stream":true' in body]:
                conn.sendall(part)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=connection, args=(conn,), daemon=True).start()


MESSAGES = [{"role": "user", "content": "Say tok."}]


@contextmanager
def building_on(transport: str) -> Iterator[None]:
    """The LLM clients built inside the block run on `transport`: `urllib3` (a worker's), or `httpx2` (httpx2's
    own, as with a proxy in the environment). An OpenAIChat builds its shard's client at its first call."""
    from worker.llm import http_pool

    saved = http_pool._environment_proxy
    if transport == "httpx2":
        http_pool._environment_proxy = lambda: True  # type: ignore[assignment]
    try:
        yield
    finally:
        http_pool._environment_proxy = saved  # type: ignore[assignment]


def warm_client(port: int, stream: bool, transport: str) -> Any:
    """An OpenAIChat on `transport`, after 20 calls."""
    from worker.llm.client import OpenAIChat

    chat = OpenAIChat(f"http://127.0.0.1:{port}/v1", "bench", stream=stream)
    with building_on(transport):
        for _ in range(20):
            chat.chat(MESSAGES, model="bench")
    return chat


def client_cpu(port: int, stream: bool, calls: int, transports: list[str]) -> dict[str, tuple[float, float]]:
    """Per transport, best and median CPU seconds per call of 5 rounds, the transports' rounds in turns."""
    chats = {name: warm_client(port, stream, name) for name in transports}
    rounds: dict[str, list[float]] = {name: [] for name in transports}
    for turn in range(5):
        for name in transports[turn % 2:] + transports[:turn % 2]:
            began = time.process_time()
            for _ in range(calls):
                chats[name].chat(MESSAGES, model="bench")
            rounds[name].append((time.process_time() - began) / calls)
    for chat in chats.values():
        chat.close()
    return {name: (min(r), statistics.median(r)) for name, r in rounds.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="10,100,400")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--transports", default="urllib3,httpx2", help="the first is measured, the second the baseline")
    ap.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    from bench.step_cpu import free_port, wait

    transports = args.transports.split(",")
    print("| tokens | transport | not streamed, us/call (best; median) | streamed, us/call (best; median) "
          "| streamed, us/chunk more | streamed, baseline / this |")
    print("|---|---|---|---|---|---|")
    for tokens in (int(n) for n in args.tokens.split(",")):
        port = free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(tokens)])
        try:
            wait(lambda port=port: socket.create_connection(("127.0.0.1", port)).close() is None, "server")
            plain = client_cpu(port, False, args.calls, transports)
            streamed = client_cpu(port, True, args.calls, transports)
        finally:
            server.terminate()
            server.wait(10)
        for name in transports:
            per_chunk = (streamed[name][0] - plain[name][0]) / (tokens + 3)
            ratio = streamed[transports[-1]][0] / streamed[name][0]
            print(f"| {tokens} | {name} | {1e6 * plain[name][0]:.0f}; {1e6 * plain[name][1]:.0f} | "
                  f"{1e6 * streamed[name][0]:.0f}; {1e6 * streamed[name][1]:.0f} | {1e6 * per_chunk:.1f} | "
                  f"{ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
