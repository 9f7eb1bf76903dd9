"""Webhook isolation: how long one tenant's plain runs take while another tenant's webhooks go to receivers
that answer 200 and then drip a byte a second forever, against the same runs on an idle worker, in one
invocation.

    python bench/webhook_isolation.py [--hostile 30] [--plain 5] [--concurrency 20] [--latency-ms 200]
                                      [--repeats 3] [--window 25] [--huge 20] [--no-shared] [--out FILE]

A fresh redis-server, `reactq stub --latency-ms L` and a dripping receiver on loopback (the one the tests
use, tests/fixtures_receiver.py), then, for each layout:
  isolated: `reactq worker --queues steps --concurrency C` as shipped: webhooks are delivered by the webhook
            worker process it starts beside itself (REACTQ_WEBHOOK_CONCURRENCY threads, default 8);
  shared:   the layout without the webhook worker (one Celery pool of C threads taking reactq.steps and
            reactq.webhooks), started as `celery -A worker.tasks.app worker -Q reactq.steps,reactq.webhooks`,
            with today's per-attempt deadline (REACTQ_WEBHOOK_DEADLINE_S, default 10 s).
1. idle: tenant "b" submits P plain runs ("What is A * B + C?", 2 steps each); the time from submit until
   the last has finished (median of R).
2. hostile: tenant "a" submits H runs whose webhooks go to the dripping receiver; once the receiver holds
   deliveries in flight, tenant "b"'s P runs are timed again and again for W seconds (--window, longer
   than an attempt's deadline: attempts end, are recorded and retried meanwhile); the median.
The ratio hostile / idle is the slowdown; the attempts' recorded outcomes (kind, error, longest duration)
show each attempt ended at its deadline.
3. huge answers (--huge N): the shipped layout, N receivers answering 200 and streaming a terabyte; the
   webhook worker's RSS growth over a warm-up delivery, and the body bytes read per attempt.
Target: isolated ratio <= 2. Exit 1 if missed, 2 on a bad run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import ROOT, Bench, finish  # noqa: E402

Row = tuple[str, float, float, int, Counter, int]  # layout, idle s, with drips s, receiver calls, outcomes, longest ms


class Site:
    """A fresh redis-server and stub, one worker (`argv`), and the in-process handles to submit runs
    (worker.service.submit, the first steps sent through a Celery client) and read their webhooks."""

    def __init__(self, bench: Bench, args: argparse.Namespace, shared: bool, env: dict[str, str] | None = None) -> None:
        from celery import Celery

        from worker.config import Settings
        from worker.store.connection import connect
        from worker.store.runs import RunStore
        from worker.store.spend import SpendStore
        from worker.store.tenant_records import TenantStore
        from worker.store.webhooks import WebhookStore
        from worker.tenancy.budgets import TenantBudgets
        from worker.tenancy.tenants import Tenants

        redis_url = bench.start_redis()
        stub_url = bench.start_stub(args.latency_ms)
        env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
               "REACTQ_TENANTS": '["a", "b"]', "REACTQ_STALE_AFTER_S": "600", "REACTQ_WEBHOOK_ALLOW_PRIVATE": "1",
               "REACTQ_WEBHOOK_RETRY_BASE_S": "1", "REACTQ_WEBHOOK_RETRY_MAX_S": "2", **(env or {})}
        if shared:  # one pool for steps and webhooks, as before webhooks had their own worker
            argv = [sys.executable, "-m", "celery", "-A", "worker.tasks.app", "worker", "-Q",
                    "reactq.steps,reactq.webhooks", "-P", "threads", "-c", str(args.concurrency),
                    "--without-gossip", "--without-mingle", "--loglevel", args.loglevel]
        else:
            argv = [sys.executable, "-m", "worker.cli", "worker", "--queues", "steps", "--concurrency",
                    str(args.concurrency), "--metrics-port", "0", "--loglevel", args.loglevel]
        self.worker = bench.procs.start("worker", argv, env)
        bench.wait_ready(["worker"], redis_url)
        self.settings = Settings(redis_url=redis_url, tenants=["a", "b"])
        self.store = RunStore(connect(redis_url, 16), self.settings.run_ttl_s)
        self.tenants = Tenants(TenantStore(self.store.r), self.settings)
        self.budgets = TenantBudgets(SpendStore(self.store.r))
        self.hooks = WebhookStore(self.store.r, keep_s=0)
        self.client = Celery("bench_webhook_client", broker=redis_url)
        self.client.conf.broker_transport_options = {"priority_steps": list(range(10))}
        self.conn = self.client.connection_for_write()

    def send_step(self, run_id: str, index: int, priority: int | None = None) -> None:
        self.client.send_task("reactq.step", args=[run_id, index], queue="reactq.steps", connection=self.conn,
                              priority=priority)

    def submit(self, specs: list, batch_id: str | None = None) -> list:
        from worker.service.submit import submit

        return submit(self.store, specs, self.settings, self.send_step, batch_id=batch_id, tenants=self.tenants,
                      budgets=self.budgets)


def one_layout(layout: str, args: argparse.Namespace, rng: random.Random, problems: list[str]) -> Row:
    from tests.fixtures_receiver import Receiver
    from worker.core.models import RunSpec
    from worker.service.submit import new_batch_id

    bench = Bench(args, Path(tempfile.mkdtemp(prefix=f"reactq-webhook-isolation-{layout}-")))
    receiver = Receiver(behaviour="drip", drip_s=1.0).start()
    try:
        site = Site(bench, args, shared=layout == "shared")

        def question() -> str:
            return f"What is {rng.randint(100, 99999)} * {rng.randint(100, 99999)} + {rng.randint(1, 9999)}?"

        def plain_runs() -> float:
            """Tenant b's runs as one batch: seconds from submit until the last has finished."""
            started = time.time()
            runs = site.submit([RunSpec(question=question(), tenant="b") for _ in range(args.plain)], new_batch_id())
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                loaded = site.store.load_runs([r.id for r in runs])
                if all(r is not None and r.status.finished for r in loaded):
                    for r in loaded:
                        if r is not None and r.status.value != "succeeded":
                            problems.append(f"{layout}: run {r.id} {r.status.value}")
                    return max(r.finished_at or 0.0 for r in loaded if r is not None) - started
                time.sleep(0.05)
            raise RuntimeError("tenant b's runs did not finish in 600 s")

        idle = statistics.median(plain_runs() for _ in range(args.repeats))
        site.submit([RunSpec(question=question(), tenant="a", webhook_url=receiver.url) for _ in range(args.hostile)])
        waited = time.monotonic() + 120
        while len(receiver.calls) < 2 and time.monotonic() < waited:
            time.sleep(0.05)
        timed, window_ends = [], time.monotonic() + args.window
        while len(timed) < args.repeats or time.monotonic() < window_ends:  # across attempts ending and retried
            timed.append(plain_runs())
            time.sleep(1)
        loaded_s = statistics.median(timed)
        attempts = [a for d in site.hooks.list("a", 100) for a in d.attempts]
        kinds = Counter(f"{a.kind.value if a.kind else 'delivered'}: {a.error}" for a in attempts)
        longest = max((a.duration_ms for a in attempts), default=0)
        site.conn.release()
        return layout, idle, loaded_s, len(receiver.calls), kinds, longest
    finally:
        receiver.stop()
        bench.procs.stop()


def huge_answers(args: argparse.Namespace, count: int) -> str:
    """The webhook worker's memory while `count` deliveries go to a receiver streaming a terabyte after its
    200 (one warm-up delivery first): RSS growth, bytes read per attempt, bytes the receiver got into its
    sockets."""
    from tests.fixtures_receiver import Receiver
    from worker.core.models import RunSpec

    bench = Bench(args, Path(tempfile.mkdtemp(prefix="reactq-webhook-huge-")))
    receiver = Receiver(behaviour="huge").start()
    try:
        site = Site(bench, args, shared=False)

        def deliver(n: int, total: int) -> None:
            site.submit([RunSpec(question=f"What is {i} + 7?", tenant="a", webhook_url=receiver.url)
                         for i in range(n)])
            deadline = time.monotonic() + 300
            while sum(d.state.value == "delivered" for d in site.hooks.list("a", 500)) < total:
                if time.monotonic() > deadline:
                    raise RuntimeError("huge answers: deliveries not done in 300 s")
                time.sleep(0.1)

        pid = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == site.worker.pid)
        deliver(1, 1)
        before = _rss_kb(pid)
        deliver(count, count + 1)
        grown = _rss_kb(pid) - before
        read = [a.response_bytes for d in site.hooks.list("a", 500) for a in d.attempts]
        site.conn.release()
        sent = sum(c.sent for c in receiver.calls)
        return (f"huge answers: {count} deliveries (+1 warm-up) to a receiver streaming 1 TiB after a 200: RSS of "
                f"the webhook worker {before / 1024:.0f} MB before, grown by {grown / 1024:.1f} MB; body bytes read "
                f"per attempt {min(read)}..{max(read)}; the receiver got {sent / 2**20:.1f} MiB into its sockets")
    finally:
        receiver.stop()
        bench.procs.stop()


def _ppid(proc_dir: Path) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _rss_kb(pid: int) -> int:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hostile", type=int, default=30, help="runs whose webhooks drip")
    ap.add_argument("--plain", type=int, default=5, help="the other tenant's plain runs, timed")
    ap.add_argument("--concurrency", type=int, default=20, help="step threads of the worker")
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=25.0, help="seconds of timing b's runs while a's drip")
    ap.add_argument("--huge", type=int, default=20, help="receivers streaming a huge body (0: skip)")
    ap.add_argument("--no-shared", action="store_true", help="skip the shared-pool layout")
    ap.add_argument("--loglevel", default="WARNING")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # the tree under test
    rng = random.Random(22)
    problems: list[str] = []
    rows = [one_layout(layout, args, rng, problems) for layout in ["isolated"] + ([] if args.no_shared else ["shared"])]
    report = [f"{args.hostile} runs of tenant a whose webhooks drip a byte a second after a 200; tenant b's "
               f"{args.plain} plain runs timed (median over {args.window:g} s); worker of {args.concurrency} step "
               f"threads, stub latency {args.latency_ms:g} ms", "",
               "| layout | tenant b idle | with drips | x idle | receiver calls | attempts recorded | "
               "longest attempt |", "|---|---|---|---|---|---|---|"]
    for layout, idle, loaded_s, calls, kinds, longest in rows:
        report.append(f"| {layout} | {idle:.2f} s | {loaded_s:.2f} s | {loaded_s / idle:.2f} | {calls} | "
                      f"{sum(kinds.values())} | {longest / 1000:.1f} s |")
    for layout, _, _, _, kinds, _ in rows:
        report.append(f"{layout} attempt outcomes: " + "; ".join(f"{n} x {k}" for k, n in kinds.most_common()))
    isolated = rows[0]
    ok = isolated[2] <= 2 * isolated[1]
    if args.huge:
        report += ["", huge_answers(args, args.huge)]
    report += ["", f"target (isolated: tenant b within 2x idle): {'met' if ok else 'MISSED'}"]
    return finish(report, problems, ok, args.out)


if __name__ == "__main__":
    sys.exit(main())
