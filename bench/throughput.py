"""Step throughput of reactq against a bare Celery chain (the floor), measured in one invocation.

    python bench/throughput.py [--procs 4] [--out FILE]

Every measurement gets its own fresh redis-server and stub process (`reactq stub --latency-ms L`)
on free 127.0.0.1 ports, then P worker processes:
  floor:  celery -A bench.floor_app worker -P threads|gevent -c C   (bench/floor_app.py: one openai-client
          chat call to the stub, streamed when reactq's is (REACTQ_LLM_STREAM, on by default), then enqueue
          the next task of the chain; N chains started. `--floor-client httpx`: a bare httpx POST instead)
  reactq: reactq worker --queues steps --concurrency C --metrics-port 0   (N runs kept in flight:
          this script submits new runs, via worker.service.submit.submit, as runs finish, and sends their
          first steps together, as `reactq batch` does: worker.tasks.steps.sending_together)
Runs are "What is A * B + C?" with fresh numbers each (no tool-cache hits): two steps each
(calculator call, final answer), one LLM call per step, no sandbox.
steps/s = chat completions the stub served in a fixed window after a warm-up, divided by the
window (the stub counts both systems the same way; reactq's committed steps are cross-checked).
CPU us/step = CPU seconds (user + system, from /proc) each group of processes spent in the window,
per completion: where the machine's 2 cores went.

Targets: (a) stub latency 0:  reactq >= 1.0 x floor (threads, unless --a-floor-pool);
         (b) stub latency 2 s, 300 in flight: reactq >= 0.9 x best(floor threads, floor gevent);
         (c) stub latency 5 s, 1,000 in flight (ideal 200 steps/s): reactq >= 0.9 x ideal, beside the
             floor; the workers' memory per run in flight is reported (RSS growth over idle / in flight).
Exit status 1 if a target is missed, 2 if a measurement went wrong (errors, failed runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_cpu import process_cpu_s  # noqa: E402

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, data: bytes | None = None, timeout: float = 5.0) -> dict:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


class Procs:
    """Every process this script starts, each in its own session, stopped by pid at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def exited(self, name: str) -> bool:
        return any(n == name and p.poll() is not None for n, p in self.procs)

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def stop(self, names: list[str] | None = None, sig: int = signal.SIGTERM, grace: float = 15.0) -> None:
        chosen = [(n, p) for n, p in self.procs if names is None or n in names]
        for _, p in chosen:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)  # the session we created for it: the process and its children
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for _, p in chosen:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs = [(n, p) for n, p in self.procs if (n, p) not in chosen]


@dataclass
class Result:
    label: str
    system: str
    pool: str
    procs: int
    concurrency: int
    in_flight: int
    latency_ms: float
    steps: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    notes: str = ""

    cpu_us: dict[str, float] = field(default_factory=dict)  # CPU per step of each process group
    rss_idle_kb: int = 0
    rss_loaded_kb: int = 0

    @property
    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def compile_tree() -> None:
    """Write the bytecode of this tree's packages, as installing reactq does. Run from a checkout with
    PYTHONDONTWRITEBYTECODE=1 (this machine sets it), every process started here would otherwise compile
    ~80 modules from source as it starts: ~60 ms of CPU more for each `reactq batch` (BENCHMARKS.md)."""
    import compileall

    for package in ("worker", "tools_sandbox", "api_stub"):
        compileall.compile_dir(str(ROOT / package), quiet=1)


class Bench:
    def __init__(self, args: argparse.Namespace, logdir: Path) -> None:
        compile_tree()
        self.args = args
        self.procs = Procs(logdir)
        self.seq = 0
        self.cpu_per_step: dict[str, float] = {}
        self.watched: dict[str, int] = {}  # group -> pid of a process started elsewhere, counted like ours
        self.on_window: Any = None  # called with "start" and "end" of measure()'s window (per-server stats)

    # --- infrastructure ------------------------------------------------------------------------
    def start_redis(self, name: str = "redis") -> str:
        import redis

        port = free_port()
        self.procs.start(name, ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--maxclients", "10000", "--tcp-backlog", "4096",
                                   "--protected-mode", "no"])
        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        client.flushall()
        client.close()
        return f"redis://127.0.0.1:{port}/0"

    def start_stub(self, latency_ms: float, faults: dict | None = None) -> str:
        """The stub's URL once it answers; `faults`: more of its FaultConfig (e.g. windowed limits)."""
        port = free_port()
        extra = ["--faults", json.dumps(faults)] if faults else []
        self.procs.start("stub", [str(BIN / "reactq"), "stub", "--port", str(port), "--latency-ms", str(latency_ms),
                                  *extra])
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                http_json(f"{url}/healthz")
                return url
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("stub did not start:\n" + self.procs.log("stub"))

    def wait_ready(self, names: list[str], redis_url: str, timeout: float = 60.0) -> None:
        """Until every worker answers a control ping (and so consumes its queue)."""
        from celery import Celery

        probe = Celery("bench_probe", broker=redis_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for name in names:
                    if self.procs.exited(name):
                        raise RuntimeError(f"{name} exited:\n" + self.procs.log(name)[-3000:])
                replies = probe.control.ping(timeout=0.5) or []
                if len(replies) >= len(names):
                    return
            raise RuntimeError(f"workers not ready after {timeout}s: {names}")
        finally:
            probe.close()

    def rss_kb(self, names: list[str]) -> int:
        """Resident memory of these worker processes, summed (kB, from /proc)."""
        total = 0
        for name, proc in self.procs.procs:
            if name in names and proc.poll() is None:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total

    def completions(self, stub_url: str) -> int:
        return int(http_json(f"{stub_url}/stub/stats", timeout=60)["completions"])

    def measure(self, stub_url: str, warmup: float, window: float, tick=None) -> tuple[int, float]:
        """Completions served in `window` seconds after `warmup` seconds; `tick()` runs meanwhile."""

        def wait(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if tick is not None:
                    tick()
                time.sleep(min(0.02, max(0.0, end - time.monotonic())))

        wait(warmup)
        if self.on_window is not None:
            self.on_window("start")
        cpu0 = self.cpu_seconds()
        c0, t0 = self.completions(stub_url), time.monotonic()
        wait(window)
        c1, t1 = self.completions(stub_url), time.monotonic()
        cpu1 = self.cpu_seconds()
        if self.on_window is not None:
            self.on_window("end")
        if c1 > c0:  # CPU per step of each group of processes over the window: where the machine went
            self.cpu_per_step = {g: (cpu1[g] - cpu0.get(g, 0.0)) / (c1 - c0) * 1e6 for g in cpu1}
        return c1 - c0, t1 - t0

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system, threads included) so far of each group of running processes
        (redis, stub, the workers, this script), from /proc."""
        groups: dict[str, float] = {"bench": process_cpu_s(os.getpid())}
        for name, proc in self.procs.procs:
            group = "workers" if name.startswith(("floor", "reactq")) else name
            groups[group] = groups.get(group, 0.0) + process_cpu_s(proc.pid)
        for group, pid in self.watched.items():
            groups[group] = groups.get(group, 0.0) + process_cpu_s(pid)
        return groups

    def scan_errors(self, names: list[str], stub_url: str) -> list[str]:
        errors = []
        for name in names:
            text = self.procs.log(name)
            for marker in ("Traceback", "MaxConnectionsError", "ConnectionError", "Timeout", "Error:"):
                if marker in text:
                    errors.append(f"{name}: {text.count(marker)} x {marker!r}")
        stats = http_json(f"{stub_url}/stub/stats", timeout=60)
        bad = {k: v for k, v in stats["by_status"].items() if k != "200"}
        if bad:
            errors.append(f"stub answered non-200: {bad}")
        return errors

    # --- the floor -----------------------------------------------------------------------------
    def floor(self, label: str, pool: str, latency_ms: float, in_flight: int, concurrency: int,
              warmup: float, window: float, procs: int | None = None) -> Result:
        procs = procs or self.args.procs
        streamed = reactq_streams()
        call = "httpx" if self.args.floor_client == "httpx" else f"openai{', streamed' if streamed else ''}"
        res = Result(label, "floor", f"{pool} ({call})", procs, concurrency, in_flight, latency_ms)
        redis_url = self.start_redis()
        stub_url = self.start_stub(latency_ms)
        env = {"FLOOR_REDIS_URL": redis_url, "FLOOR_LLM_BASE_URL": f"{stub_url}/v1",
               "FLOOR_MAX_CONNECTIONS": str(max(1024, 2 * concurrency)),
               "FLOOR_CLIENT": self.args.floor_client, "FLOOR_STREAM": "1" if streamed else "0"}
        names = []
        for _ in range(procs):
            self.seq += 1
            name = f"floor-{pool}-{self.seq}"
            names.append(name)
            self.procs.start(name, [str(BIN / "celery"), "-A", "bench.floor_app", "worker", "-Q", "bench.floor",
                                    "-P", pool, "-c", str(concurrency), "--loglevel", self.args.loglevel,
                                    "-n", f"{name}@%h", "--without-gossip", "--without-mingle"], env)
        try:
            self.wait_ready(names, redis_url)
            from celery import Celery

            client = Celery("bench_floor_client", broker=redis_url)
            client.conf.broker_pool_limit = 8
            with client.connection_for_write() as conn:
                for chain in range(in_flight):
                    client.send_task("bench.floor.step", args=[chain, 0], queue="bench.floor", connection=conn)
            res.steps, res.seconds = self.measure(stub_url, warmup, window)
            res.cpu_us = dict(self.cpu_per_step)
            res.errors = self.scan_errors(names, stub_url)
        finally:
            self.procs.stop(names, signal.SIGQUIT, grace=10)  # cold shutdown: the chains never end
            self.procs.stop(["stub", "redis"])
        return res

    # --- reactq --------------------------------------------------------------------------------
    def reactq(self, label: str, latency_ms: float, in_flight: int, concurrency: int,
               warmup: float, window: float, state_url: str | None = None, wait_replicas: int = 1) -> Result:
        """`state_url`: run state there (a Redis Cluster's redis+cluster:// URL, say) and the broker on a
        redis-server of its own; by default one redis-server is both."""
        pool = f"threads (openai{', streamed' if reactq_streams() else ''})"
        res = Result(label, "reactq", pool, self.args.procs, concurrency, in_flight, latency_ms)
        broker_url = self.start_redis("broker" if state_url else "redis")
        redis_url = state_url or broker_url
        stub_url = self.start_stub(latency_ms)
        env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
               "REACTQ_BROKER_URL": broker_url, "REACTQ_REDIS_WAIT_REPLICAS": str(wait_replicas),
               "REACTQ_REDIS_MAX_CONNECTIONS": str(max(512, 2 * concurrency)),
               "REACTQ_LLM_MAX_CONNECTIONS": str(max(512, 2 * concurrency))}
        names = []
        for _ in range(self.args.procs):
            self.seq += 1
            name = f"reactq-{self.seq}"
            names.append(name)
            self.procs.start(name, [str(BIN / "reactq"), "worker", "--queues", "steps", "--concurrency",
                                    str(concurrency), "--metrics-port", "0", "--loglevel", self.args.loglevel], env)
        try:
            self.wait_ready(names, broker_url)
            res.rss_idle_kb = self.rss_kb(names)
            from celery import Celery

            from worker.config import Settings
            from worker.core.models import RunSpec
            from worker.names import PRIORITY_STEPS
            from worker.service.submit import new_batch_id, submit
            from worker.store.connection import connect
            from worker.store.runs import RunStore
            from worker.store.spend import SpendStore
            from worker.store.tenant_records import TenantStore
            from worker.tasks.broker import transport_for
            from worker.tasks.steps import sending_together
            from worker.tenancy.budgets import TenantBudgets
            from worker.tenancy.tenants import Tenants

            settings = Settings(redis_url=redis_url, broker_url=broker_url, llm_base_url=f"{stub_url}/v1",
                                redis_wait_replicas=wait_replicas)
            store = RunStore(connect(redis_url, 16), settings.run_ttl_s, wait_replicas=wait_replicas)
            tenants = Tenants(TenantStore(store.r), settings, policy_memo_s=1.0)  # as `reactq batch` (Runtime.tenants)
            client = Celery("bench_reactq_client", broker=broker_url)
            client.conf.broker_pool_limit = 8
            client.conf.broker_transport = transport_for(broker_url)  # sends as reactq's own app does
            client.conf.broker_transport_options = {"priority_steps": PRIORITY_STEPS}  # to the same lists
            batch_id = new_batch_id()
            rng = random.Random(1234)
            used: set[tuple[int, int, int]] = set()

            def question() -> str:
                while True:
                    a, b, c = rng.randint(100, 99999), rng.randint(100, 99999), rng.randint(1, 9999)
                    if (a, b, c) not in used:
                        used.add((a, b, c))
                        return f"What is {a} * {b} + {c}?"

            state = {"submitted": 0}

            def top_up() -> None:
                done = store.batches.finished_count(batch_id)
                need = in_flight - (state["submitted"] - done)
                if need > 0:
                    specs = [RunSpec(question=question()) for _ in range(need)]
                    with sending_together(client) as send:  # as `reactq batch` sends a part's first steps
                        submit(store, specs, settings, send, batch_id=batch_id, tenants=tenants,
                               budgets=TenantBudgets(SpendStore(store.r)))
                    state["submitted"] += need

            top_up()
            res.steps, res.seconds = self.measure(stub_url, warmup, window, tick=top_up)
            res.cpu_us = dict(self.cpu_per_step)
            res.rss_loaded_kb = self.rss_kb(names)
            done_ids = store.batches.finished_since(batch_id, 0)
            runs = [r for r in store.load_runs(done_ids) if r is not None]
            statuses: dict[str, int] = {}
            for r in runs:
                statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
            steps_per_run = {r.current_step for r in runs}
            res.notes = (f"{len(runs)} runs finished ({statuses}), steps per run {sorted(steps_per_run)}, "
                         f"{state['submitted']} submitted")
            res.errors = self.scan_errors(names, stub_url)
            bad = {s: n for s, n in statuses.items() if s != "succeeded"}
            if bad:
                res.errors.append(f"runs not completed: {bad}")
            if steps_per_run - {2}:
                res.errors.append(f"runs with other than 2 steps: {sorted(steps_per_run)}")
        finally:
            self.procs.stop(names, signal.SIGQUIT, grace=10)
            self.procs.stop(["stub", "redis", "broker"])
        return res


def reactq_streams() -> bool:
    """Whether reactq's workers stream their completions here (REACTQ_LLM_STREAM, as their settings read it)."""
    from worker.config import Settings

    return Settings().llm_stream


def run_times(store: Any, run_ids: list[str], problems: list[str], timeout: float) -> list[float] | None:
    """Each run's seconds from creation to finish once all have ended (a run that did not succeed in two
    steps is noted in `problems`); None if they had not within `timeout`. `store`: a worker RunStore."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = store.load_runs(run_ids)
        if all(r is not None and r.status.finished for r in runs):
            for r in runs:
                if r is not None and (r.status.value != "succeeded" or r.current_step != 2):
                    problems.append(f"run {r.id}: {r.status.value} after {r.current_step} steps")
            return [r.finished_at - r.created_at for r in runs if r is not None and r.finished_at]
        time.sleep(0.05)
    return None


def finish(report: list[str], problems: list[str], ok: bool, out: str | None) -> int:
    """Print a benchmark's report headed by its exact command (and write it to `out`); the exit code: 2 if
    anything went wrong, else 0 when the target was met and 1 when it was missed."""
    text = "\n".join([f"command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`", "", *report, *problems])
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    if problems:
        return 2
    return 0 if ok else 1


def table(results: list[Result]) -> str:
    lines = ["| case | system | pool | procs x conc | in flight | stub latency | steps | window s | steps/s "
             "| CPU us/step: workers, stub, redis, bench |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        cpu = ", ".join(f"{r.cpu_us.get(g, 0):.0f}" for g in ("workers", "stub", "redis", "bench"))
        lines.append(f"| {r.label} | {r.system} | {r.pool} | {r.procs} x {r.concurrency} | {r.in_flight} | "
                     f"{r.latency_ms:g} ms | {r.steps} | {r.seconds:.1f} | {r.rate:.1f} | {cpu} |")
    return "\n".join(lines)


def floors_then_reactq(bench: Bench, args: argparse.Namespace, case: str,
                       results: list[Result]) -> tuple[list[Result], Result]:
    """Case `case` (b or c, its settings from `args`): the floor on threads and on gevent, then reactq,
    each added to `results` and printed as it ends."""
    def arg(name: str) -> float:
        return getattr(args, f"{case}_{name}")

    def keep(result: Result) -> Result:
        results.append(result)
        print(table([result]), flush=True)
        return result

    latency, in_flight, concurrency = arg("latency_ms"), int(arg("in_flight")), int(arg("concurrency"))
    floors = [keep(bench.floor(case, pool, latency, in_flight, concurrency, arg("warmup"), arg("window")))
              for pool in ("threads", "gevent")]
    return floors, keep(bench.reactq(case, latency, in_flight, concurrency, arg("warmup"), arg("window")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4, help="worker processes, for the floor and reactq alike")
    ap.add_argument("--a-in-flight", type=int, default=100)
    ap.add_argument("--a-concurrency", type=int, default=8,
                    help="per worker process (8: the floor's best and reactq's at latency 0, BENCHMARKS.md)")
    ap.add_argument("--a-floor-pool", choices=["threads", "prefork", "gevent"], default="threads",
                    help="the floor's pool in case (a), to find its best (reactq's pool is threads)")
    ap.add_argument("--a-floor-procs", type=int, default=None, help="the floor's processes in case (a) (--procs)")
    ap.add_argument("--a-floor-concurrency", type=int, default=None,
                    help="the floor's concurrency per process in case (a) (--a-concurrency)")
    ap.add_argument("--a-warmup", type=float, default=5.0)
    ap.add_argument("--a-window", type=float, default=20.0)
    ap.add_argument("--b-in-flight", type=int, default=300)
    ap.add_argument("--b-concurrency", type=int, default=300, help="per worker process")
    ap.add_argument("--b-latency-ms", type=float, default=2000.0)
    ap.add_argument("--b-warmup", type=float, default=8.0)
    ap.add_argument("--b-window", type=float, default=30.0)
    ap.add_argument("--c-in-flight", type=int, default=1000)
    ap.add_argument("--c-concurrency", type=int, default=300, help="per worker process")
    ap.add_argument("--c-latency-ms", type=float, default=5000.0)
    ap.add_argument("--c-warmup", type=float, default=15.0)
    ap.add_argument("--c-window", type=float, default=30.0)
    ap.add_argument("--floor-client", choices=["openai", "httpx"], default="openai",
                    help="the floor's call: the openai client's chat.completions.create (streamed as reactq's is), "
                         "or a bare httpx POST")
    ap.add_argument("--loglevel", default="WARNING", help="worker log level (floor and reactq alike)")
    ap.add_argument("--only", choices=["a", "b", "c"], default=None, help="measure one case (a: ~1 minute)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure case (a) this many times, floor and reactq alternated, and compare the best "
                         "of each (on a shared machine, other load can only lower a measurement)")
    ap.add_argument("--out", default=None, help="write a markdown report here")
    args = ap.parse_args()

    logdir = Path(tempfile.mkdtemp(prefix="reactq-bench-"))
    bench = Bench(args, logdir)
    results: list[Result] = []
    verdicts: list[tuple[str, float, float, bool]] = []
    try:
        if args.only in (None, "a"):
            floors_a, reactqs_a = [], []
            for _ in range(args.repeat):  # alternated, so a burst of other load hits both sides alike
                fa = bench.floor("a", args.a_floor_pool, 0, args.a_in_flight,
                                 args.a_floor_concurrency or args.a_concurrency, args.a_warmup, args.a_window,
                                 procs=args.a_floor_procs)
                results.append(fa)
                floors_a.append(fa)
                print(table([fa]), flush=True)
                ra = bench.reactq("a", 0, args.a_in_flight, args.a_concurrency, args.a_warmup, args.a_window)
                results.append(ra)
                reactqs_a.append(ra)
                print(table([ra]), flush=True)
            best_floor, best_reactq = max(r.rate for r in floors_a), max(r.rate for r in reactqs_a)
            ratio = best_reactq / best_floor if best_floor else 0.0
            verdicts.append(("a", ratio, 1.0, ratio >= 1.0))
        if args.only in (None, "b"):
            floors, rb = floors_then_reactq(bench, args, "b", results)
            best = max(f.rate for f in floors)
            ratio = rb.rate / best if best else 0.0
            verdicts.append(("b", ratio, 0.9, ratio >= 0.9))
        if args.only in (None, "c"):
            _, rc = floors_then_reactq(bench, args, "c", results)
            ideal = args.c_in_flight / (args.c_latency_ms / 1000)
            ratio = rc.rate / ideal
            verdicts.append(("c", ratio, 0.9, ratio >= 0.9))
            per_run = (rc.rss_loaded_kb - rc.rss_idle_kb) / args.c_in_flight
            rc.notes += (f"; ideal {ideal:.0f} steps/s; workers' RSS {rc.rss_idle_kb // 1024} MiB idle, "
                         f"{rc.rss_loaded_kb // 1024} MiB with {args.c_in_flight} runs in flight: "
                         f"{per_run:.0f} kB per run in flight")
    finally:
        bench.procs.stop()

    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    machine = f"nproc {os.cpu_count()}, Python {platform.python_version()}, {platform.platform()}"
    report = [f"command: `{command}`", f"machine: {machine}", "", table(results), ""]
    for label, ratio, target, ok in verdicts:
        of_best = " (best of each)" if label == "a" and args.repeat > 1 else ""
        versus = "ideal" if label == "c" else "floor"
        report.append(f"({label}) reactq / {versus}{of_best} = {ratio:.2f} (target >= {target}): "
                      f"{'met' if ok else 'MISSED'}")
    problems = [f"{r.system} {r.pool} ({r.label}): {e}" for r in results for e in r.errors]
    notes = [f"{r.system} ({r.label}): {r.notes}" for r in results if r.notes]
    report += [""] + notes + problems + [f"logs: {logdir}"]
    text = "\n".join(report)
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if problems:
        return 2
    return 0 if all(ok for *_, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
