"""Fairness under a backlog: how long one small tenant's run and one interactive run take while another
tenant has 2,000 runs queued, against the same runs on an idle system, in one invocation.

    python bench/fairness.py [--backlog 2000] [--procs 2] [--concurrency 50] [--latency-ms 500]

A fresh redis-server, `reactq stub --latency-ms L` and P `reactq worker --queues steps` processes (the
infrastructure of bench/throughput.py). Runs are "What is A * B + C?" with fresh numbers (2 steps each).
1. idle: tenant "b"'s batch run and an interactive run (`interactive=True`, what `ask` and a single API
   run use), each alone, 3 times; the median time from submit to finish (the run record's timestamps).
2. backlog, fair (reactq as shipped): tenant "a" submits the backlog as one batch; 2 s later tenant "b"
   submits one batch run and then an interactive run is submitted; their times are measured while
   "a"'s backlog is still queued (the script checks it is).
3. backlog, FIFO: the same with every priority dropped (one FIFO list, what reactq did before), for
   comparison.
Target: in (2) both runs finish within 3x their idle time. Exit status 1 if missed, 2 on a bad run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import BIN, Bench, finish, run_times  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=50, help="threads per worker process")
    ap.add_argument("--latency-ms", type=float, default=500.0)
    ap.add_argument("--loglevel", default="WARNING")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from celery import Celery

    from worker.config import Settings
    from worker.core.models import RunSpec
    from worker.service.submit import new_batch_id, submit
    from worker.store.connection import connect
    from worker.store.runs import RunStore
    from worker.store.spend import SpendStore
    from worker.store.tenant_records import TenantStore
    from worker.tenancy.budgets import TenantBudgets
    from worker.tenancy.tenants import Tenants

    bench = Bench(args, Path(tempfile.mkdtemp(prefix="reactq-fairness-")))
    rng = random.Random(7)
    report: list[str] = []
    problems: list[str] = []
    try:
        redis_url = bench.start_redis()
        stub_url = bench.start_stub(args.latency_ms)
        env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
               "REACTQ_TENANTS": '["a", "b"]', "REACTQ_STALE_AFTER_S": "600"}
        names = [f"reactq-{i}" for i in range(args.procs)]
        for name in names:
            bench.procs.start(name, [str(BIN / "reactq"), "worker", "--queues", "steps", "--concurrency",
                                     str(args.concurrency), "--metrics-port", "0", "--loglevel", args.loglevel], env)
        bench.wait_ready(names, redis_url)
        settings = Settings(redis_url=redis_url, tenants=["a", "b"])
        store = RunStore(connect(redis_url, 16), settings.run_ttl_s)
        tenants, budgets = Tenants(TenantStore(store.r), settings), TenantBudgets(SpendStore(store.r))
        client = Celery("bench_fairness_client", broker=redis_url)
        client.conf.broker_transport_options = {"priority_steps": list(range(10))}
        conn = client.connection_for_write()
        fifo = {"on": False}

        def send_step(run_id: str, index: int, priority: int | None = None) -> None:
            client.send_task("reactq.step", args=[run_id, index], queue="reactq.steps", connection=conn,
                             priority=None if fifo["on"] else priority)

        def question() -> str:
            return f"What is {rng.randint(100, 99999)} * {rng.randint(100, 99999)} + {rng.randint(1, 9999)}?"

        def one(tenant: str, interactive: bool) -> str:
            [run] = submit(store, [RunSpec(question=question(), tenant=tenant)], settings, send_step,
                           batch_id=None if interactive else new_batch_id(), interactive=interactive,
                           tenants=tenants, budgets=budgets)
            return run.id

        def wait_all(run_ids: list[str], timeout: float = 900) -> list[float]:
            times = run_times(store, run_ids, problems, timeout)
            if times is None:
                raise RuntimeError(f"runs not finished after {timeout}s")
            return times

        def queued() -> int:
            return sum(store.r.llen(k) for k in store.r.keys("reactq.steps*") if store.r.type(k) == b"list")

        idle_b = statistics.median(wait_all([one("b", False)])[0] for _ in range(3))
        idle_i = statistics.median(wait_all([one("b", True)])[0] for _ in range(3))
        report.append(f"idle: tenant b's batch run {idle_b:.2f} s, interactive run {idle_i:.2f} s (median of 3)")

        rows = []
        for mode in ("fair", "fifo"):
            fifo["on"] = mode == "fifo"
            specs = [RunSpec(question=question(), tenant="a") for _ in range(args.backlog)]
            backlog = submit(store, specs, settings, send_step, batch_id=new_batch_id(), tenants=tenants,
                             budgets=budgets)
            time.sleep(2)
            b_id, i_id = one("b", False), one("b", True)
            waiting_then = queued()
            b_s, i_s = wait_all([b_id, i_id])
            waiting_after = queued()
            a_done = sum(1 for r in store.load_runs([r.id for r in backlog]) if r is not None and r.status.finished)
            rows.append((mode, b_s, i_s, waiting_then, waiting_after, a_done))
            wait_all([r.id for r in backlog])
        fair = rows[0]
        report += ["", "| mode | tenant b's run | x idle | interactive run | x idle | steps queued at submit / "
                   "when both done | tenant a runs done by then |", "|---|---|---|---|---|---|---|"]
        for mode, b_s, i_s, w0, w1, a_done in rows:
            report.append(f"| {mode} | {b_s:.2f} s | {b_s / idle_b:.2f} | {i_s:.2f} s | {i_s / idle_i:.2f} | "
                          f"{w0} / {w1} | {a_done} of {args.backlog} |")
        ok = fair[1] <= 3 * idle_b and fair[2] <= 3 * idle_i and fair[4] > 0
        report.append("")
        report.append(f"target (fair: both within 3x idle, with tenant a's backlog still queued): "
                      f"{'met' if ok else 'MISSED'}")
        conn.release()
    finally:
        bench.procs.stop()
    return finish(report, problems, ok, args.out)


if __name__ == "__main__":
    sys.exit(main())
