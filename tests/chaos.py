"""The chaos soak, shared by tests/test_chaos_soak.py (small) and bench/chaos_soak.py (thousands of runs).

One soak: a redis-server of its own (AOF, `appendfsync everysec` as deployed), the api_stub over HTTP
answering 1 call in 25 with a 500 and 1 in 40 with a 429, three step workers and one Docker sandbox worker
(real `python -m worker.cli worker` processes), and `reactq batch` of arithmetic questions (calculator)
and a share of python questions (sandbox), each with one right answer. Meanwhile a random step worker is
SIGKILLed and replaced every `kill_every_s`, and Redis is SIGKILLed and restarted at given shares of the
results written, its AOF first cut back by the last second of writes (what `everysec` may lose in a host
crash; a SIGKILL alone loses nothing Redis acknowledged). `reactq batch` is started again with the same
`--out` whenever it exits before every line is written, as a user would.

Every run must end right: each question id has exactly one result line, `succeeded`, whose answer is the
expected number. LLM calls are counted by a recorder in front of the stub (each completion request: the
client port, when it started and ended, its status, a digest of its messages): calls answered 200 beyond
the runs' steps are repeated calls, and a repeat (a 200 for messages already answered 200) is charged to
the first fault after the call it repeats, beside what that fault put at risk: the calls in flight on the
killed worker (its TCP ports to the stub, read from /proc just before the kill) plus those it had answered
in the second before (a step whose reply came but whose commit had not), or for Redis the same over every
worker (the writes of that second are the ones cut).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from api_stub import FaultConfig, StubServer
from tests.fixtures_cluster import Cluster, cluster_environment
from tests.fixtures_sandbox import tier_toml
from tests.fixtures_services import RedisServer

COMPLETIONS = "/v1/chat/completions"
AOF = "appendonly.aof"  # redis-server 6's one AOF file in its --dir (tests/fixtures_services.RedisServer)
# The default tenant's tier (`standard`) with a quota the soak never reaches: the soak is about faults,
# not the tenant's sandbox quota.
SOAK_TIER = tier_toml("standard", (4, 100_000, 1_000_000.0), cpus=1.0, memory_mb=128, wall_time_s=10,
                      cpu_time_s=5, output_bytes=16384, tmpfs_mb=16, pool_size=2)


@dataclass
class Call:
    port: int
    start: float
    end: float | None = None
    status: int | None = None
    digest: str = ""


class CallLog:
    """Every chat completion request the stub served, in arrival order (appended from its event loop)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def in_flight(self, at: float, ports: set[int] | None = None) -> int:
        return sum(1 for c in list(self.calls) if c.start <= at and (c.end is None or c.end > at)
                   and (ports is None or c.port in ports))

    def answered_between(self, start: float, end: float, ports: set[int] | None = None) -> int:
        return sum(1 for c in list(self.calls) if c.status == 200 and c.end is not None and start <= c.end <= end
                   and (ports is None or c.port in ports))


class RecordCalls:
    """ASGI middleware in front of the stub app: records each completion request in a CallLog."""

    def __init__(self, app: Any, log: CallLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != COMPLETIONS:
            await self.app(scope, receive, send)
            return
        call = Call(port=(scope.get("client") or ("", 0))[1], start=time.time())
        self.log.calls.append(call)
        body: list[bytes] = []

        async def received() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                call.status = message["status"]
            await send(message)

        try:
            await self.app(scope, received, sending)
        finally:
            call.end = time.time()
            try:
                messages = json.loads(b"".join(body)).get("messages")
            except (ValueError, AttributeError):
                messages = None
            call.digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Fault:
    kind: str  # "worker" (SIGKILL and replace a random step worker) or "redis" (SIGKILL and restart)
    at: float  # seconds since the soak started
    in_flight: int  # LLM calls in flight on the victim (the killed worker; for Redis: every worker)
    answered_last_s: int = 0  # calls the victim had answered 200 in the second before the kill (its step
    # may not have committed yet; for Redis, its AOF may not have kept the commit)
    repeats: int = 0  # calls answered 200 again for messages first answered before this fault (and after
    # the fault before it)
    detail: str = ""


@dataclass
class SoakConfig:
    runs: int = 200
    python_share: float = 0.1  # of the runs, python questions through the Docker sandbox
    step_workers: int = 3
    concurrency: int = 8  # threads per step worker
    sandbox_concurrency: int = 4
    kill_every_s: float = 15.0
    redis_kills_at: tuple[float, ...] = (0.3, 0.6)  # shares of the result lines written
    redis_down_s: float = 1.0
    # A SIGKILL alone loses no acknowledged write (Redis writes the AOF before it replies; the page cache
    # keeps it); everysec's loss is a host crash's: the AOF is cut back to its length this long before
    # the kill (0: plain SIGKILL).
    lose_last_s: float = 1.0
    latency_ms: float = 200.0
    latency_jitter_ms: float = 100.0
    error_rate_500: float = 1 / 25
    error_rate_429: float = 1 / 40
    retry_after_s: float = 0.2
    llm_max_retries: int = 8  # 6.5% of calls fail: (0.065 ** 9) ~ 2e-11, never in thousands of runs
    seed: int = 22
    timeout_s: float = 600.0
    max_invocations: int = 40


@dataclass
class SoakReport:
    runs: int
    python_runs: int
    seconds: float
    lost: list[str]
    wrong: list[dict]
    duplicate_lines: int
    invocations: list[dict]  # each `reactq batch` invocation: exit code, seconds, the end of its stderr
    faults: list[Fault]
    calls_requested: int
    calls_answered: int  # status 200
    by_status: dict[str, int]
    min_calls: int  # the runs' steps: one answered call each
    repeated_calls: int  # calls_answered - min_calls
    repeats_by_digest: int  # 200s for messages already answered 200
    unexplained_repeats: int  # of those, repeats of calls that began after the last fault
    at_risk: int  # the faults' in-flight (and, for Redis, last-second) calls, summed
    reaper_actions: dict[str, int]  # re-kicks by action, from the workers' logs
    task_errors: list[str]  # tasks that raised (Celery's "raised unexpected" lines), from the same logs
    logdir: str
    config: dict = field(default_factory=dict)

    def summary(self) -> dict:
        data = asdict(self)
        data["wrong"] = data["wrong"][:10]
        data["lost"] = data["lost"][:20]
        return data


def questions(config: SoakConfig, path: Path) -> tuple[dict[str, str], set[str]]:
    """The batch's input file: unique questions, their expected answers, and the python ones' ids."""
    rng = random.Random(config.seed)
    expected: dict[str, str] = {}
    python: set[str] = set()
    seen: set[str] = set()
    with path.open("w") as f:
        while len(expected) < config.runs:
            qid = f"q{len(expected)}"
            if rng.random() < config.python_share:
                lo, hi = rng.randint(2, 500), rng.randint(501, 5000)
                question, answer = f"What is the sum of all integers from {lo} to {hi}?", sum(range(lo, hi + 1))
                python.add(qid)
            else:
                a, b, c = rng.randint(2, 999), rng.randint(2, 999), rng.randint(1, 99)
                question, answer = f"What is {a} * {b} + {c}?", a * b + c
            if question in seen:  # unique prompts: a repeat is then a repeated call, never another run's
                python.discard(qid)
                continue
            seen.add(question)
            expected[qid] = str(answer)
            f.write(json.dumps({"id": qid, "question": question}) + "\n")
    return expected, python


def step_worker_ports(pid: int, stub_port: int) -> set[int]:
    """The local ports of the worker's TCP connections to the stub (its calls in flight use them)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        ports = set()
        for proc in procs:
            for conn in proc.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == stub_port:
                    ports.add(conn.laddr.port)
        return ports
    except psutil.Error:
        return set()


class Chaos:
    """The fault thread: a random step worker SIGKILLed and replaced every `kill_every_s`, Redis SIGKILLed
    and restarted when the results reach each share in `redis_kills_at`."""

    def __init__(self, config: SoakConfig, cluster: Cluster, redis_server: RedisServer, stub: StubServer,
                 log: CallLog, steppers: list, out: Path, started: float) -> None:
        self.config, self.cluster, self.redis, self.stub, self.log = config, cluster, redis_server, stub, log
        self.steppers, self.out, self.started = steppers, out, started
        self.rng = random.Random(config.seed + 1)
        self.faults: list[Fault] = []
        self.errors: list[BaseException] = []
        self._aof: deque[tuple[float, int, int]] = deque(maxlen=100)  # (time, inode, size) of the AOF
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        if self.errors:
            raise RuntimeError(f"the fault thread failed: {self.errors[0]!r}") from self.errors[0]

    def _written(self) -> int:
        return len(self.out.read_text().splitlines()) if self.out.exists() else 0

    def _loop(self) -> None:
        next_kill = time.monotonic() + self.config.kill_every_s
        redis_due = [share * self.config.runs for share in self.config.redis_kills_at]
        try:
            while not self._stop.wait(0.2):
                self._sample_aof()
                if redis_due and self._written() >= redis_due[0]:
                    redis_due.pop(0)
                    self.kill_redis()
                if time.monotonic() >= next_kill:
                    self.kill_worker()
                    next_kill = time.monotonic() + self.config.kill_every_s
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def kill_worker(self) -> None:
        victim = self.steppers.pop(self.rng.randrange(len(self.steppers)))
        ports = step_worker_ports(victim.pid, self.stub.port)
        now = time.time()
        self.cluster.kill(victim)
        self.faults.append(Fault("worker", round(now - self.started, 1), self.log.in_flight(now, ports),
                                 self.log.answered_between(now - 1, now, ports), detail=f"pid {victim.pid}"))
        self.steppers.append(self.cluster.start_worker(queues="steps", concurrency=self.config.concurrency))

    def _sample_aof(self) -> None:
        try:
            st = (self.redis.workdir / AOF).stat()
        except FileNotFoundError:
            return
        self._aof.append((time.time(), st.st_ino, st.st_size))

    def _lose_last_writes(self, killed_at: float) -> str:
        """Cut the AOF back to its length `lose_last_s` before the kill, as a host crash under everysec
        would; returns what was cut."""
        if self.config.lose_last_s <= 0:
            return "nothing cut"
        path = self.redis.workdir / AOF
        earlier = [(ino, size) for t, ino, size in self._aof if t <= killed_at - self.config.lose_last_s]
        st = path.stat()
        if not earlier or earlier[-1][0] != st.st_ino:
            return "nothing cut (the AOF was rewritten meanwhile)"
        cut = st.st_size - earlier[-1][1]
        os.truncate(path, earlier[-1][1])
        return f"{cut} AOF bytes cut"

    def kill_redis(self) -> None:
        assert self.redis.proc is not None
        now = time.time()
        self.redis.proc.send_signal(signal.SIGKILL)
        self.redis.proc.wait(10)
        cut = self._lose_last_writes(now)
        window = max(1.0, self.config.lose_last_s)
        self.faults.append(Fault("redis", round(now - self.started, 1), self.log.in_flight(now),
                                 self.log.answered_between(now - window, now),
                                 detail=f"{self._written()} lines written, {cut}"))
        self._aof.clear()
        time.sleep(self.config.redis_down_s)
        self.redis.start()  # same port, same data directory: what the AOF kept


def check_results(out: Path, expected: dict[str, str]) -> tuple[list[str], list[dict], int, int]:
    """(ids with no line, lines that are not a success with the expected answer, duplicate lines, steps)."""
    lines = [json.loads(t) for t in out.read_text().splitlines()] if out.exists() else []
    by_id: dict[str, dict] = {}
    duplicates = 0
    for line in lines:
        duplicates += line["id"] in by_id
        by_id[line["id"]] = line
    lost = [qid for qid in expected if qid not in by_id]
    wrong = [line for qid, line in by_id.items()
             if line.get("status") != "succeeded" or (line.get("answer") or "").strip() != expected.get(qid)]
    return lost, wrong, duplicates, sum(int(line.get("steps") or 0) for line in by_id.values())


def worker_log_findings(workdir: Path) -> tuple[dict[str, int], list[str]]:
    """The reaper's re-kicks by action, and the tasks that raised, across every worker's log."""
    actions: dict[str, int] = {}
    errors: list[str] = []
    for path in sorted(workdir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            msg = str(entry.get("msg", ""))
            if msg == "re-kicking stranded run":
                actions[entry.get("action", "?")] = actions.get(entry.get("action", "?"), 0) + 1
            elif "raised unexpected" in msg:
                errors.append(f"{path.name}: {msg[:300]}")
    return actions, errors


def charge_repeats(log: CallLog, faults: list[Fault], started: float) -> tuple[int, int]:
    """Charge each repeat (a 200 for messages already answered 200) to the first fault after the call it
    repeats began: the fault that lost that call's reply (a worker's in flight, Redis's last second), even
    when the repeat comes later (a run stranded by lost writes waits for the reaper). Returns (repeats,
    repeats of calls that began after the last fault: no fault explains them)."""
    first: dict[str, Call] = {}
    repeats = unexplained = 0
    for call in sorted((c for c in log.calls if c.status == 200), key=lambda c: c.start):
        if call.digest not in first:
            first[call.digest] = call
            continue
        repeats += 1
        after = [f for f in faults if f.at >= first[call.digest].start - started]
        if after:
            after[0].repeats += 1
        else:
            unexplained += 1
    return repeats, unexplained


def run_batch_until_done(cluster: Cluster, infile: Path, out: Path, expected: dict[str, str],
                         config: SoakConfig, started: float) -> list[dict]:
    """`reactq batch IN --out OUT`, started again (same --out) each time it exits before every line is in."""
    invocations: list[dict] = []
    deadline = time.monotonic() + config.timeout_s
    while len(invocations) < config.max_invocations and time.monotonic() < deadline:
        t0 = time.time()
        batch = cluster.start_batch(infile, out)
        stderr = cluster.finish_batch(batch, timeout=max(1.0, deadline - time.monotonic()))
        lost, _, _, _ = check_results(out, expected)
        invocations.append({"at": round(t0 - started, 1), "seconds": round(time.time() - t0, 1),
                            "exit": batch.returncode, "missing_after": len(lost),
                            "stderr_tail": stderr.strip().splitlines()[-1:] if batch.returncode else []})
        if batch.returncode == 0 and not lost:
            break
        time.sleep(1.0)  # a user reads the message, then runs the same command again
    return invocations


def soak(config: SoakConfig, workdir: Path, sandbox_image: str) -> SoakReport:
    """Run one soak in `workdir` (logs, data) and report; every process it started is stopped."""
    log = CallLog()
    stub = StubServer(faults=FaultConfig(
        latency_ms=config.latency_ms, latency_jitter_ms=config.latency_jitter_ms, seed=config.seed,
        error_rate_500=config.error_rate_500, error_rate_429=config.error_rate_429,
        retry_after_s=config.retry_after_s))
    stub.app.add_middleware(RecordCalls, log=log)  # type: ignore[arg-type]
    stub.start()
    (workdir / "redis").mkdir(parents=True, exist_ok=True)
    redis_server = RedisServer(workdir / "redis")
    redis_server.start()
    tiers = workdir / "tiers.toml"
    tiers.write_text(SOAK_TIER)
    env = cluster_environment(redis_server.url, stub.base_url)
    env.update({"REACTQ_LLM_MAX_RETRIES": str(config.llm_max_retries), "REACTQ_SANDBOX_TIERS_FILE": str(tiers)})
    cluster = Cluster(env, workdir)
    infile, out = workdir / "in.jsonl", workdir / "out.jsonl"
    expected, python = questions(config, infile)
    try:
        steppers = [cluster.start_worker(queues="steps", concurrency=config.concurrency)
                    for _ in range(config.step_workers)]
        cluster.start_worker(queues="sandbox", concurrency=config.sandbox_concurrency,
                             REACTQ_SANDBOX_BACKEND="docker", REACTQ_SANDBOX_IMAGE=sandbox_image)
        started = time.time()
        chaos = Chaos(config, cluster, redis_server, stub, log, steppers, out, started)
        chaos.start()
        try:
            invocations = run_batch_until_done(cluster, infile, out, expected, config, started)
        finally:
            chaos.stop()
        seconds = time.time() - started
        lost, wrong, duplicates, steps = check_results(out, expected)
        answered = [c for c in log.calls if c.status == 200]
        repeats, unexplained = charge_repeats(log, chaos.faults, started)
        actions, task_errors = worker_log_findings(workdir)
        by_status: dict[str, int] = {}
        for c in log.calls:
            by_status[str(c.status)] = by_status.get(str(c.status), 0) + 1
        return SoakReport(
            runs=config.runs, python_runs=len(python), seconds=round(seconds, 1), lost=lost, wrong=wrong,
            duplicate_lines=duplicates, invocations=invocations, faults=chaos.faults,
            calls_requested=len(log.calls), calls_answered=len(answered), by_status=by_status, min_calls=steps,
            repeated_calls=len(answered) - steps, repeats_by_digest=repeats, unexplained_repeats=unexplained,
            at_risk=sum(f.in_flight + f.answered_last_s for f in chaos.faults), reaper_actions=actions,
            task_errors=task_errors, logdir=str(workdir), config=asdict(config))
    finally:
        cluster.stop()
        redis_server.stop()
        stub.stop()



def built_sandbox_image() -> str:
    """The sandbox image's tag, built offline first if the engine lacks it (what the `sandbox_image`
    fixture does, for bench/chaos_soak.py)."""
    import docker

    from tools_sandbox.backends.image import build_image
    from tools_sandbox.base.config import SandboxSettings

    tag = SandboxSettings().sandbox_image
    client = docker.from_env(timeout=120)
    try:
        build_image(client, tag, log=lambda _msg: None)
    finally:
        client.close()
    return tag
