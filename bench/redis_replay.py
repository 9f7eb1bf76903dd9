"""redis-server's CPU per step, alone and under many workers: the step path's own requests, replayed.

    python bench/redis_replay.py [--runs 400] [--connections 1,4,16,64] [--rounds 3] [--broker-in-commit]
                                 [--redis-server PATH]

1. Capture. A redis-server and `reactq stub` (latency 0) on free ports; --runs runs of "What is A * B + C?"
   (2 steps: calculator, final answer) driven through the real step path in this process, one at a time
   (tests/harness.py: StepRunner, RunStore, OpenAIChat; no Celery), as bench/step_cpu.py does. Every
   request this process sends to Redis is kept, as the bytes sent, under its run and phase: the run's
   submission, or its steps. By default the broker is apart (REACTQ_BROKER_URL on another server): the
   commit writes no message, so what is kept is the state store's own work; --broker-in-commit keeps the
   next step's message in the commit (the harness's list stands in for Celery's, without kombu's reads).
2. Replay, per round and per C of --connections, on a fresh redis-server: the scripts and every run's
   submission first (not measured), then the runs' steps from C connections at once. Each connection takes
   the next run and sends its requests one at a time, each after the replies to the one before, as a
   worker does. The client is one thread (selectors, hiredis), cheap beside a step's Python.
   Reported: redis-server's CPU (INFO cpu) over the steps / steps, steps/s, and its share of one core.
   Checked: every run's record says `succeeded` with 2 steps, or the round fails: the replay did what
   the capture did.

At C=1 redis-server wakes up for every request and sleeps after it (bench/step_cpu.py's case, minus the
harness's Python between requests). With many workers it serves several connections per wake-up: the CPU
per step at a C where it is busy most of the time is what bounds one redis-server's steps/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from pathlib import Path

import hiredis
import redis
from redis.connection import Connection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.step_cpu import BIN, free_port, redis_rusage, wait  # noqa: E402

Request = tuple[bytes, int]  # the bytes sent, how many replies they ask for


def commands_in(data: bytes) -> int:
    """How many commands a request's RESP bytes hold (a pipeline sends several at once)."""
    count, i = 0, 0
    while i < len(data):
        end = data.index(b"\r\n", i)  # *<arguments>
        arguments, i = int(data[i + 1:end]), end + 2
        for _ in range(arguments):
            end = data.index(b"\r\n", i)  # $<length>, then the argument
            i = end + 2 + int(data[i + 1:end]) + 2
        count += 1
    return count


def start_redis(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, start_new_session=True)
    wait(lambda: redis.Redis(port=port).ping(), "redis-server")
    return proc, port


def capture(args: argparse.Namespace, workdir: Path) -> tuple[list[Request], list[list[Request]], list[list[Request]]]:
    """Scripts loaded, then per run: its submission's requests and its steps' requests."""
    from tests.harness import Harness
    from worker.config import Settings
    from worker.core.models import RunSpec
    from worker.service.submit import new_batch_id, submit

    sport = free_port()
    stub = subprocess.Popen([str(BIN / "reactq"), "stub", "--port", str(sport), "--latency-ms", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    server, rport = start_redis(args.redis_server, workdir)
    sent: list[bytes] = []

    class Recording(Connection):
        """Keeps what it sends, but not a new connection's handshake (CLIENT SETINFO: an error before 7.2)."""

        connecting = False

        def on_connect(self):  # type: ignore[no-untyped-def]
            self.connecting = True
            try:
                super().on_connect()
            finally:
                self.connecting = False

        def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
            if not self.connecting:
                sent.append(command if isinstance(command, bytes) else b"".join(command))
            return super().send_packed_command(command, check_health)

    try:
        wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{sport}/healthz", timeout=1).status == 200, "stub")
        settings = Settings(redis_url=f"redis://127.0.0.1:{rport}/0", llm_base_url=f"http://127.0.0.1:{sport}/v1")
        h = Harness(settings, real_llm=True, redis_client=redis.Redis(connection_pool=redis.BlockingConnectionPool(
            host="127.0.0.1", port=rport, max_connections=8, connection_class=Recording)))
        if not args.broker_in_commit:
            h.runner.dispatch = dataclasses.replace(h.runner.dispatch, step_commands=None)
        rng, batch_id = random.Random(7), new_batch_id()
        submissions, steps = [], []
        for _ in range(args.runs):
            a, b, c = rng.randint(100, 99999), rng.randint(100, 99999), rng.randint(1, 9999)
            first = len(sent)
            submit(h.store, [RunSpec(question=f"What is {a} * {b} + {c}?")], settings, h.dispatch.next_step,
                   batch_id=batch_id, tenants=h.rt.tenants, budgets=h.rt.budgets)
            middle = len(sent)
            outcomes = h.drain(limit=4)
            assert len(outcomes) == 2, outcomes
            submissions.append([(data, commands_in(data)) for data in sent[first:middle]])
            steps.append([(data, commands_in(data)) for data in sent[middle:]])
        loads = [(data, 1) for data in sent if b"\r\nSCRIPT\r\n$4\r\nLOAD\r\n" in data.upper()]
        return loads, submissions, steps
    finally:
        for proc in (stub, server):
            proc.terminate()
            proc.wait(10)


def replay(port: int, runs: list[list[Request]], connections: int) -> list[str]:
    """Each run's requests in order from `connections` connections at once; returns the error replies."""
    pending = deque(runs)
    selector = selectors.DefaultSelector()
    errors: list[str] = []

    @dataclasses.dataclass
    class Conn:
        sock: socket.socket
        reader: hiredis.Reader = dataclasses.field(default_factory=hiredis.Reader)
        queue: deque[Request] = dataclasses.field(default_factory=deque)
        awaited: int = 0

    def send_next(conn: Conn) -> bool:
        if not conn.queue:
            if not pending:
                return False
            conn.queue = deque(pending.popleft())
        data, conn.awaited = conn.queue.popleft()
        conn.sock.sendall(data)
        return True

    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(sock)
        if send_next(conn):
            selector.register(sock, selectors.EVENT_READ, conn)
    while selector.get_map():
        for key, _ in selector.select():
            conn = key.data
            conn.reader.feed(conn.sock.recv(1 << 20))
            while conn.awaited and (reply := conn.reader.gets()) is not False:
                conn.awaited -= 1
                if isinstance(reply, hiredis.ReplyError):
                    errors.append(str(reply))
            if not conn.awaited and not send_next(conn):
                selector.unregister(conn.sock)
                conn.sock.close()
    return errors


def check_finished(port: int, runs: int) -> None:
    r = redis.Redis(port=port)
    records = [r.get(key) for key in r.scan_iter("reactq:run:*", count=1000) if key.count(b":") == 2]
    statuses = [json.loads(raw)["status"] for raw in records if raw]
    steps = [r.llen(key) for key in r.scan_iter("reactq:run:*:steps", count=1000)]
    if statuses.count("succeeded") != runs or steps != [2] * runs:
        raise SystemExit(f"the replay did not finish every run: {statuses.count('succeeded')} of {runs} succeeded, "
                         f"steps lists {sorted(set(steps))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--connections", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=3, help="each C this many times, alternated")
    ap.add_argument("--broker-in-commit", action="store_true")
    ap.add_argument("--redis-server", default=shutil.which("redis-server", path="/usr/bin") or "redis-server",
                    help="the binary (default: Debian's package, which the images deploy, else the first on PATH)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reactq-replay-"))
    loads, submissions, steps = capture(args, workdir)
    n_steps = 2 * args.runs
    per_step = sum(len(run) for run in steps) / n_steps
    commands = sum(n for run in steps for _, n in run) / n_steps
    print(f"captured {args.runs} runs: {per_step:.2f} requests and {commands:.1f} commands a step (top level; a "
          f"script's own commands not counted), {sum(len(d) for run in steps for d, _ in run) / n_steps:.0f} bytes "
          "sent a step")
    conns = [int(c) for c in args.connections.split(",")]
    results: dict[int, list[tuple[float, float, float]]] = {c: [] for c in conns}
    for _ in range(args.rounds):
        for c in conns:
            server, port = start_redis(args.redis_server, workdir)
            try:
                stats = redis.Redis(port=port)
                replay(port, [loads], 1)
                replay(port, submissions, 8)
                cpu0, t0 = redis_rusage(stats), time.perf_counter()
                errors = replay(port, steps, c)
                wall, cpu = time.perf_counter() - t0, redis_rusage(stats) - cpu0
                check_finished(port, args.runs)
                if errors:
                    raise SystemExit(f"{len(errors)} error replies in the steps' replay: {sorted(set(errors))[:3]}")
                results[c].append((1e6 * cpu / n_steps, n_steps / wall, cpu / wall))
            finally:
                server.terminate()
                server.wait(10)
    print("| connections | redis CPU us/step (best; median) | steps/s (best; median) | redis busy (median) |")
    print("|---|---|---|---|")
    for c, rows in results.items():
        us, rate, busy = zip(*rows, strict=True)
        print(f"| {c} | {min(us):.0f}; {statistics.median(us):.0f} | {max(rate):.0f}; {statistics.median(rate):.0f} | "
              f"{100 * statistics.median(busy):.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
