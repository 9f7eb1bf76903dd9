"""CPU one reactq step spends on our side, measured in process with the test harness (tests/harness.py).

    python bench/step_cpu.py [--runs 300] [--floor] [--monitor] [--submit-first] [--broker-apart] [--python]

Starts its own redis-server and `reactq stub` (latency 0) on free ports, then drives N runs of
"What is A * B + C?" (2 steps each: calculator, final answer) through the real StepRunner, RunStore
and OpenAIChat, one step at a time in this one thread, with no Celery. Reports this process's CPU
seconds per step and the Redis round trips per step, redis-server's own CPU per step (from /proc over
all chunks, and from INFO cpu per chunk; and, from INFO commandstats, the time it spent executing each
command, per step: wall time, which a busy machine inflates), and the
submission's CPU and round trips per run (each run is submitted into one batch, as bench/throughput.py
does). `--floor` also measures what the throughput
floor's task does per step (one HTTP chat call with httpx, JSON decoded), so the difference is the
CPU a step spends outside the LLM call. By default each run is submitted and then its two steps
delivered, so that each run ends its batch as it stands (and reads the batch); `--submit-first`
submits each chunk's runs and then delivers their steps (as a batch is worked through), and reports
redis-server's CPU for the steps alone and for the submissions apart. `--monitor` prints, after the
figures, every command redis-server ran for one more run (MONITOR: a script's own commands too, marked
"lua"). `--broker-apart`: the commit does not write the next step's message (the broker is another
server, REACTQ_BROKER_URL), it is sent after the commit: here queued in memory, so redis-server does only
the state store's work. `--python`: each run asks for "print(6*7)" run in python instead (three deliveries:
the step that sends the code to the sandbox, its continuation once the result is stored, the answer); the
bench stores each sandbox result itself, with a client of its own (the sandbox worker's side is not measured),
and also reports CPU and round trips per run.
Profile with: py-spy record -o prof.svg -- python bench/step_cpu.py
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
CHUNK = 25  # runs (50 steps) per measured chunk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has spent, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not up yet (refused, reset, loading)
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up in {timeout}s")


def redis_rusage(client) -> float:  # type: ignore[no-untyped-def]
    """CPU seconds redis-server has spent (INFO cpu: its getrusage, finer than /proc's ticks)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def print_monitored(client, one_run) -> None:  # type: ignore[no-untyped-def]
    """Every command redis-server runs while `one_run` runs, as MONITOR sees it (arguments cut short)."""
    with client.monitor() as monitor:
        one_run()
        client.ping()  # the end marker: MONITOR lists it once the run's commands are through
        print("one run's commands (MONITOR):")
        while True:
            seen = monitor.next_command()
            if seen["command"] == "PING" and seen["client_type"] != "lua":
                return
            where = " lua" if seen["client_type"] == "lua" else ""
            print(f"  {where:4} {seen['command'][:160]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--floor", action="store_true", help="also measure the floor's per-step work")
    ap.add_argument("--monitor", action="store_true", help="also print the commands of one more run")
    ap.add_argument("--submit-first", action="store_true",
                    help="each chunk: submit its runs, then deliver their steps (redis-server's CPU for each apart)")
    ap.add_argument("--python", action="store_true", help="runs that call python (a stored sandbox result) "
                    "instead of the calculator")
    ap.add_argument("--broker-apart", action="store_true",
                    help="the next step's message is not written by the commit but sent after it, as with "
                         "REACTQ_BROKER_URL on another server (the harness queues it in memory: no broker work here)")
    args = ap.parse_args()

    import redis
    from redis.connection import Connection

    from tests.harness import Harness
    from tools_sandbox import ExecuteRequest, SandboxResult
    from worker.config import Settings
    from worker.core.models import RunSpec
    from worker.core.outcome import Outcome
    from worker.service.submit import new_batch_id, submit

    workdir = Path(tempfile.mkdtemp(prefix="reactq-stepcpu-"))
    rport, sport = free_port(), free_port()
    procs = [
        subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL,
                         start_new_session=True),
        subprocess.Popen([str(BIN / "reactq"), "stub", "--port", str(sport), "--latency-ms", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True),
    ]
    try:
        wait(lambda: redis.Redis(port=rport).ping(), "redis-server")
        wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{sport}/healthz", timeout=1).status == 200, "stub")
        round_trips = {"n": 0}

        class Counting(Connection):
            def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
                round_trips["n"] += 1
                return super().send_packed_command(command, check_health)

        settings = Settings(redis_url=f"redis://127.0.0.1:{rport}/0", llm_base_url=f"http://127.0.0.1:{sport}/v1")
        h = Harness(settings, real_llm=True, redis_client=redis.Redis(connection_pool=redis.BlockingConnectionPool(
            host="127.0.0.1", port=rport, max_connections=8, connection_class=Counting)))
        if args.broker_apart:
            h.runner.dispatch = dataclasses.replace(h.runner.dispatch, step_commands=None)
        rng = random.Random(7)
        results = redis.Redis(port=rport)  # the sandbox's side (--python), not counted
        RESULT = SandboxResult(exit_code=0, stdout="42\n", stderr="", tier="standard", backend="docker",
                               duration_ms=4).model_dump_json()

        spent = {"cpu": 0.0, "wall": 0.0, "trips": 0, "redis": 0.0, "submit": 0.0, "submit_trips": 0}
        batch_id = new_batch_id()
        redis_pid = procs[0].pid

        def submit_one() -> None:
            """Submit one run into the batch (measured apart from its steps)."""
            a, b, c = rng.randint(100, 99999), rng.randint(100, 99999), rng.randint(1, 9999)
            trips, cpu = round_trips["n"], time.process_time()
            question = ("Run this python code:\n```python\nprint(6*7)\n```" if args.python
                        else f"What is {a} * {b} + {c}?")
            submit(h.store, [RunSpec(question=question)], settings, h.dispatch.next_step,
                   batch_id=batch_id, tenants=h.rt.tenants, budgets=h.rt.budgets)
            spent["submit"] += time.process_time() - cpu
            spent["submit_trips"] += round_trips["n"] - trips

        def deliver(runs: int) -> int:
            """Deliver the queued steps of `runs` submitted runs (measured)."""
            trips, cpu, wall = round_trips["n"], time.process_time(), time.perf_counter()
            outcomes = h.drain(limit=4 * runs)
            expected = [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER] * runs
            if args.python:  # the sandbox's part, not measured: each result stored, its continuation queued
                spent["cpu"] += time.process_time() - cpu
                spent["trips"] += round_trips["n"] - trips
                for request in h.dispatch.sandbox:
                    req = ExecuteRequest.model_validate(request)
                    results.set(req.result_key, RESULT)
                    h.dispatch.next_step(*req.continue_args)
                h.dispatch.sandbox.clear()
                trips, cpu = round_trips["n"], time.process_time()
                outcomes += h.drain(limit=4 * runs)
                expected += [Outcome.WAITING] * runs
            spent["cpu"] += time.process_time() - cpu
            spent["wall"] += time.perf_counter() - wall
            spent["trips"] += round_trips["n"] - trips
            assert sorted(outcomes) == sorted(expected), outcomes
            return len(outcomes)

        def one_run() -> int:
            """Submit a run, then deliver its steps: it ends the batch as it stands (one batch check a run)."""
            redis_cpu = process_cpu(redis_pid)
            submit_one()
            n = deliver(1)
            spent["redis"] += process_cpu(redis_pid) - redis_cpu
            return n

        for _ in range(20):  # warm-up: imports, pools, caches
            one_run()
        stats_client = redis.Redis(port=rport)
        stats_client.config_resetstat()  # INFO commandstats from here on: the measured chunks only
        # The machine is shared: the CPU a step costs is taken as the lowest of several chunks' averages
        # (other processes can only add to a chunk's CPU time, through caches and frequency).
        chunks, submit_chunks, steps, trips, submit_trips, redis_cpu = [], [], 0, 0, 0, 0.0
        redis_chunks, redis_steps, redis_submits = [], [], []
        for _ in range(max(1, args.runs // CHUNK)):
            spent.update(cpu=0.0, wall=0.0, trips=0, redis=0.0, submit=0.0, submit_trips=0)
            server_cpu = redis_rusage(stats_client)
            if args.submit_first:  # the chunk's runs submitted, then their steps delivered: redis-server's
                for _ in range(CHUNK):  # CPU for each part apart
                    submit_one()
                submitted = redis_rusage(stats_client)
                n = deliver(CHUNK)
                redis_submits.append((submitted - server_cpu) / CHUNK)
                redis_steps.append((redis_rusage(stats_client) - submitted) / n)
            else:
                n = sum(one_run() for _ in range(CHUNK))
            redis_chunks.append((redis_rusage(stats_client) - server_cpu) / n)
            chunks.append(spent["cpu"] / n)
            redis_cpu += spent["redis"]
            submit_chunks.append(spent["submit"] / CHUNK)
            steps, trips = steps + n, trips + int(spent["trips"])
            submit_trips += int(spent["submit_trips"])
        cpu = min(chunks)
        per_run = 3 if args.python else 2  # deliveries
        runs = steps // per_run
        print(f"reactq: {steps} steps, {1e6 * cpu:.0f} us CPU/step (best chunk; median "
              f"{1e6 * statistics.median(chunks):.0f}), {trips / steps:.1f} Redis round trips/step")
        if args.python:
            print(f"per python run ({per_run} deliveries): {1e6 * per_run * cpu:.0f} us CPU (best chunk; median "
                  f"{1e6 * per_run * statistics.median(chunks):.0f}), {trips / runs:.1f} Redis round trips")
        if not args.submit_first:
            print(f"redis-server: {1e6 * redis_cpu / steps:.0f} us CPU/step (all chunks: /proc counts in 10 ms "
                  "ticks; submissions included)")
        print(f"redis-server: {1e6 * min(redis_chunks):.0f} us CPU/step (best chunk; median "
              f"{1e6 * statistics.median(redis_chunks):.0f}; INFO cpu, its own rusage in us; submissions included)")
        if args.submit_first:
            print(f"redis-server: {1e6 * min(redis_steps):.0f} us CPU/step for the steps alone (best chunk; median "
                  f"{1e6 * statistics.median(redis_steps):.0f}), {1e6 * min(redis_submits):.0f} us CPU/run for the "
                  f"submissions (best chunk; median {1e6 * statistics.median(redis_submits):.0f})")
        print(f"submit: {1e6 * min(submit_chunks):.0f} us CPU/run (best chunk; median "
              f"{1e6 * statistics.median(submit_chunks):.0f}), {submit_trips / runs:.1f} Redis round trips/run")
        commands = {name.removeprefix("cmdstat_"): stat for name, stat in stats_client.info("commandstats").items()}
        usec = sum(stat["usec"] for stat in commands.values())
        print(f"redis commands: {usec / steps:.0f} us/step executing commands (INFO commandstats; submissions "
              f"included), {sum(stat['calls'] for stat in commands.values()) / steps:.1f} calls/step; by command:")
        for name, stat in sorted(commands.items(), key=lambda item: -item[1]["usec"])[:12]:
            print(f"  {name}: {stat['usec'] / steps:.1f} us/step, {stat['calls'] / steps:.2f} calls/step, "
                  f"{stat['usec_per_call']:.1f} us/call")
        if args.monitor:
            print_monitored(stats_client, one_run)
        if args.floor:
            import httpx

            sys.argv = sys.argv[:1]
            from bench.floor_app import _BODY_BYTES

            client = httpx.Client()
            url = f"http://127.0.0.1:{sport}/v1/chat/completions"
            headers = {"content-type": "application/json", "authorization": "Bearer floor"}
            for _ in range(40):
                client.post(url, content=_BODY_BYTES, headers=headers).json()
            floors = []
            for _ in range(len(chunks)):
                cpu0 = time.process_time()
                for _ in range(2 * CHUNK):
                    response = client.post(url, content=_BODY_BYTES, headers=headers)
                    response.raise_for_status()
                    response.json()
                floors.append((time.process_time() - cpu0) / (2 * CHUNK))
            floor = min(floors)
            print(f"floor:  {1e6 * floor:.0f} us CPU/step (best chunk; median {1e6 * statistics.median(floors):.0f}; "
                  "one httpx chat call, JSON decoded)")
            print(f"reactq - floor: {1e6 * (cpu - floor):.0f} us CPU/step outside the LLM call")
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
