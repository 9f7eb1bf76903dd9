"""CPU of one message sent by a worker, through Celery's `send_task` and through worker/tasks/publish.py.

    python bench/publish_cost.py [--messages 3000] [--rounds 3]

Starts its own redis-server (no persistence) on a free port and, in this process, with the worker's Celery app
(worker/tasks/app.py, on that Redis), sends the same messages both ways, alternated round by round: a sandbox
call as a step sends it (`send_sandbox`'s body for "print(6*7)"), and the continuation a sandbox worker sends
when the call's result is stored (the step task on its run's priority). Reports this process's CPU a message
(`time.process_time`), the publish's round trip to Redis included, and the median of the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.step_cpu import free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        os.environ["REACTQ_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        return measure(args.messages, args.rounds)
    finally:
        server.terminate()
        server.wait()


def measure(n: int, rounds: int) -> int:
    import redis

    from worker.names import SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK, STEPS_QUEUE
    from worker.runtime.sandbox_bridge import sandbox_request
    from worker.tasks.steps import app, worker_publisher

    client = redis.Redis.from_url(os.environ["REACTQ_REDIS_URL"])
    for _ in range(50):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    publisher = worker_publisher()
    assert publisher is not None
    now = time.time()
    bodies = [{**sandbox_request("print(6*7)", run_id=f"{i:032x}", index=0, call_id="c", tier="standard",
                                 tenant="t0", deadline_at=now + 600, queued_at=now), "continue_priority": 3}
              for i in range(n + 1)]
    ways: dict[str, Callable[[dict[str, Any]], None]] = {
        "sandbox call, Celery send_task": lambda b: app.send_task(SANDBOX_TASK, args=[b], queue=SANDBOX_QUEUE),
        "sandbox call, publish.py": lambda b: publisher.send_task(SANDBOX_TASK, [b], SANDBOX_QUEUE),
        "continuation, Celery send_task": lambda b: app.send_task(STEP_TASK, args=b["continue_args"],
                                                                  queue=STEPS_QUEUE, priority=3, declare=[]),
        "continuation, publish.py": lambda b: publisher.send_task(STEP_TASK, b["continue_args"], STEPS_QUEUE, 3),
    }
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, send in ways.items():
            client.flushall()
            send(bodies[0])  # first-use costs (the producer pool, a connection) left out
            started = time.process_time()
            for body in bodies[1:]:
                send(body)
            figures[name].append((time.process_time() - started) / n * 1e6)
    print(f"{n} messages a round, {rounds} rounds; CPU of this process a message, us")
    print("| message, sent with | rounds | median |\n|---|---|---:|")
    for name, values in figures.items():
        print(f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
