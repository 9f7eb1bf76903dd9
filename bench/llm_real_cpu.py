"""What a real model's streamed answer costs the worker's client side, per transport beneath the httpx2 client.

    export REACTQ_TEST_LLAMA_SERVER=$(bash scripts/build-llama-server.sh)
    export REACTQ_TEST_GGUF=$(bash scripts/fetch-test-model.sh)
    python bench/llm_real_cpu.py [--pairs 10] [--max-tokens 300]

Starts llama-server (the suite's real model: the binary and GGUF from the environment, as tests/test_real_model.py)
on a free port, and in this process two OpenAIChat clients (what every step uses), one on each transport:
`urllib3` (worker/llm/http_transport.py, a worker's) and `httpx2` (httpx2's own, httpcore2 and h11: a worker's
when the environment names an HTTP proxy). Each pair of calls asks the same question of both, in alternating
order, for --max-tokens tokens at temperature 0 (the same answer every time), streamed as a step streams. This
process's CPU a call (time.process_time around it; the server's CPU is not counted): median and best, and per
token of the answer. Unlike bench/llm_stream_cpu.py's server, which writes its tokens at once, a real model
writes one every few ms, and the client wakes up for each.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.llm_stream_cpu import building_on  # noqa: E402
from bench.step_cpu import free_port, wait  # noqa: E402

QUESTION = [{"role": "user", "content": "Write a long story about a cat who learns to count to one hundred."}]


def client(port: int, transport: str) -> Any:
    """An OpenAIChat whose shard's client is built on `transport` (by a first, short call)."""
    from worker.llm.client import OpenAIChat

    chat = OpenAIChat(f"http://127.0.0.1:{port}/v1", "bench", timeout_s=120.0)
    with building_on(transport):
        chat.chat(QUESTION, model="bench", max_tokens=8, temperature=0)
    return chat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=300)
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [os.environ["REACTQ_TEST_LLAMA_SERVER"], "-m", os.environ["REACTQ_TEST_GGUF"], "--host", "127.0.0.1",
         "--port", str(port), "--jinja", "-c", "4096", "-np", "1", "-t", "1", "--alias", "bench"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait(lambda: socket.create_connection(("127.0.0.1", port)).close() is None, "llama-server's port")
        wait(lambda: _healthy(port), "llama-server to load the model")
        chats = {name: client(port, name) for name in ("urllib3", "httpx2")}
        cpu: dict[str, list[float]] = {name: [] for name in chats}
        tokens: dict[str, list[int]] = {name: [] for name in chats}
        for pair in range(args.pairs):
            for name in ("urllib3", "httpx2") if pair % 2 == 0 else ("httpx2", "urllib3"):
                began = time.process_time()
                reply = chats[name].chat(QUESTION, model="bench", max_tokens=args.max_tokens, temperature=0)
                cpu[name].append(time.process_time() - began)
                tokens[name].append(reply.usage.completion_tokens)
    finally:
        server.kill()
        server.wait(10)
    print("| transport | answer, tokens (median) | client CPU a call, ms (median; best) | us a token |")
    print("|---|---:|---|---:|")
    for name in chats:
        median, n = statistics.median(cpu[name]), statistics.median(tokens[name])
        print(f"| {name} | {n:.0f} | {1e3 * median:.1f}; {1e3 * min(cpu[name]):.1f} | {1e6 * median / max(n, 1):.0f} |")
    return 0


def _healthy(port: int) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main())
