"""Tool isolation: how long tenant b's plain runs take on a step worker while tenant a's tool calls bomb it
(GIL-holding, hung and calculator-bomb calls), against the same runs on the same worker without them, in
one invocation.

    python bench/tool_isolation.py [--runs 20] [--concurrency 32] [--latency-ms 50] [--gil-thread]

A fresh redis-server, `reactq stub --latency-ms L` and one `reactq worker --queues steps` importing
tests/hostile_tools.py (REACTQ_TOOL_MODULES), whose `spin` (isolation="process") and `hang` (a thread)
have a 60 s deadline, so they stay in flight while b's runs are measured. Runs are "What is A * B + C?"
with fresh numbers (2 steps: a calculator call, the answer); a run's time is its record's finished_at -
created_at.
1. quiet: b's N runs, submitted at once; their median run time (the median of --rounds such batches)
   and the largest.
2. bombed: tenant a submits 2 `spin` runs (one holds a tool process, its share; the other is refused
   "busy"), 4 `hang` runs (the per-tenant stuck-thread cap) and 6 calculator bombs (round(1, -10**9), (10**4000)**10000,
   pow(10**3999+7, ...)); once spin and hang have started and the rest has ended, b's runs as in 1.
   (--without-spin: no spin runs.)
3. quiet again, once a's runs have ended (drift check).
With --gil-thread, 4. on a second worker: the same spin function registered as a *thread* tool (what an
inline tool was before), to show what the process pool buys: b's runs get 60 s to finish.
Target: bombed median <= 1.5 x quiet median. Exit status 1 if missed, 2 on a bad run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the
# processes started (`reactq stub`, `reactq worker`) run this tree, installed or not

from bench.throughput import BIN, Bench, finish, run_times  # noqa: E402

BOMBS = (["call spin with 1"] * 2 + ["call hang with 1"] * 4
         + ["call calculator with round(1, -10**9)", "call calculator with (10**4000)**10000",
            "call calculator with pow(10**3999+7, 10**3999+1, 10**3999+9)"] * 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=32,
                    help="the worker's threads: above --runs plus the bombs, so no run queues for a thread")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per phase (the median is reported)")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--gil-thread", action="store_true", help="also measure a GIL-holding thread tool")
    ap.add_argument("--without-spin", action="store_true",
                    help="bomb without the spin calls (what the spinning tool process's CPU costs)")
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

    logdir = Path(tempfile.mkdtemp(prefix="reactq-tool-isolation-"))
    bench = Bench(args, logdir)
    rng = random.Random(7)
    report: list[str] = []
    problems: list[str] = []
    try:
        redis_url = bench.start_redis()
        stub_url = bench.start_stub(args.latency_ms)
        env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
               "REACTQ_TENANTS": '["a", "b"]', "REACTQ_STALE_AFTER_S": "600",
               "REACTQ_TOOL_MODULES": '["tests.hostile_tools"]', "REACTQ_TEST_TOOL_TIMEOUT_S": "60"}
        settings = Settings(redis_url=redis_url, tenants=["a", "b"])
        store = RunStore(connect(redis_url, 16), settings.run_ttl_s)
        tenants, budgets = Tenants(TenantStore(store.r), settings), TenantBudgets(SpendStore(store.r))
        client = Celery("bench_tool_isolation_client", broker=redis_url)
        client.conf.broker_transport_options = {"priority_steps": list(range(10))}
        conn = client.connection_for_write()

        def send_step(run_id: str, index: int, priority: int | None = None) -> None:
            client.send_task("reactq.step", args=[run_id, index], queue="reactq.steps", connection=conn,
                             priority=priority)

        def start_worker(name: str, markers: Path, **extra: str) -> None:
            markers.mkdir()
            bench.procs.start(name, [str(BIN / "reactq"), "worker", "--queues", "steps", "--concurrency",
                                     str(args.concurrency), "--metrics-port", "0", "--loglevel", args.loglevel],
                              {**env, "REACTQ_TEST_MARKERS": str(markers), **extra})
            bench.wait_ready([name], redis_url)

        def batch(tenant: str, questions: list[str]) -> list[str]:
            runs = submit(store, [RunSpec(question=q, tenant=tenant) for q in questions], settings, send_step,
                          batch_id=new_batch_id(), tenants=tenants, budgets=budgets)
            return [r.id for r in runs]

        def plain() -> list[str]:
            return [f"What is {rng.randint(100, 99999)} * {rng.randint(100, 99999)} + {rng.randint(1, 9999)}?"
                    for _ in range(args.runs)]

        def wait_all(run_ids: list[str], timeout: float = 300) -> list[float] | None:
            """Run times once all ended; None if they did not within `timeout`."""
            return run_times(store, run_ids, problems, timeout)

        def measured(label: str, rounds: int = 1) -> tuple[float, float]:
            """The median (over rounds) of b's runs' median time, and the largest time seen."""
            medians, worst = [], 0.0
            for _ in range(rounds):
                times = wait_all(batch("b", plain()))
                if times is None:
                    raise RuntimeError(f"{label}: b's runs did not finish")
                medians.append(statistics.median(times))
                worst = max(worst, *times)
            return statistics.median(medians), worst

        def unfinished(run_ids: list[str]) -> int:
            return sum(1 for r in store.load_runs(run_ids) if r is not None and not r.status.finished)

        def wait_started(markers: Path, names: set[str]) -> None:
            deadline = time.monotonic() + 120
            while {p.name for p in markers.iterdir()} < names:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{names} did not start; logs in {logdir}")
                time.sleep(0.05)

        start_worker("worker", logdir / "markers")
        measured("warm-up")
        quiet = measured("quiet", args.rounds)
        chosen = [q for q in BOMBS if not (args.without_spin and "spin" in q)]
        bombs = batch("a", chosen)
        wait_started(logdir / "markers", {"hang"} if args.without_spin else {"spin", "hang"})
        lasting = 4 if args.without_spin else 5  # hang's 4 calls and one spin; the rest is refused at once
        settle = time.monotonic() + 60
        while unfinished(bombs) > lasting and time.monotonic() < settle:
            time.sleep(0.05)
        bombed = measured("bombed", args.rounds)
        in_flight = unfinished(bombs)
        if wait_all(bombs, timeout=240) is None:  # each ends once its call passes its deadline
            problems.append("tenant a's runs did not end")
        quiet2 = measured("quiet again", args.rounds)
        rows = [("quiet", *quiet), ("bombed", *bombed), ("quiet again", *quiet2)]
        report += [f"{args.runs} runs of tenant b (2 steps each), one worker of {args.concurrency} threads, "
                   f"stub latency {args.latency_ms:g} ms", "",
                   "| b's runs | median | max | median x quiet |", "|---|---|---|---|"]
        report += [f"| {label} | {med:.2f} s | {mx:.2f} s | {med / quiet[0]:.2f} |" for label, med, mx in rows]
        report.append(f"\ntenant a's runs still in flight (spin, hang) when b's bombed runs had all ended: "
                      f"{in_flight} of {len(bombs)}")
        ok = bombed[0] <= 1.5 * quiet[0] and in_flight > 0
        bench.procs.stop(["worker"], grace=5)

        if args.gil_thread:
            markers = logdir / "markers-gil"
            start_worker("worker-gil", markers, REACTQ_TEST_SPIN_IN_THREAD="1")
            measured("gil warm-up")
            gil_quiet = measured("gil quiet", args.rounds)
            batch("a", ["call spin with 1"])
            wait_started(markers, {"spin"})
            frozen = wait_all(batch("b", plain()), timeout=60)
            report.append("")
            report.append(f"spin as a thread tool (before: inline tools ran on the step's thread): quiet median "
                          f"{gil_quiet[0]:.2f} s; with one spinning call, b's runs "
                          + ("did not finish within 60 s" if frozen is None else
                             f"median {statistics.median(frozen):.2f} s "
                             f"({statistics.median(frozen) / gil_quiet[0]:.1f} x)"))
            bench.procs.stop(["worker-gil"], sig=9, grace=5)
        report.append("")
        report.append(f"target (bombed median within 1.5 x quiet, tenant a's calls still in flight): "
                      f"{'met' if ok else 'MISSED'}")
        conn.release()
    finally:
        bench.procs.stop()
    return finish(report, problems, ok, args.out)


if __name__ == "__main__":
    sys.exit(main())
