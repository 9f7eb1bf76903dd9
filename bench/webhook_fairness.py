"""Webhook fairness: how long after its run ends one tenant's webhook arrives while another tenant's
webhooks go to a receiver that takes the request and never answers, against the same on an idle worker.

    python bench/webhook_fairness.py [--hostile 64] [--window 40] [--concurrency 20] [--latency-ms 200]
                                     [--no-uncapped] [--out FILE]

A fresh redis-server, `reactq stub --latency-ms L`, `reactq worker --queues steps` as shipped (its webhook
worker of 8 threads, the 10 s attempt deadline, retries after 1 s, 2 s), and two receivers on loopback (the
tests', tests/fixtures_receiver.py): one that hangs, one that answers 200 and notes when each call came.
For each layout:
  capped:   the shipped caps (REACTQ_WEBHOOK_TENANT_IN_FLIGHT, _HOST_IN_FLIGHT, _RETRY_THREADS);
  uncapped: the caps at 10,000 and every thread open to retries: one line for every tenant, as before.
1. idle: tenant "b" submits one run with a webhook, R times in a row; the delay from the run's end to its
   webhook's arrival (median, max).
2. hostile: tenant "a" submits H runs whose webhooks go to the hanging receiver; once all have finished
   (their deliveries queued), tenant "b"'s run is timed again and again for W seconds (longer than the
   attempt deadline: a's attempts time out and are retried meanwhile).
Target: capped, tenant b's webhook within 2 s of its run's end every time. Exit 1 if missed, 2 on a bad run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import ROOT, Bench, finish  # noqa: E402
from bench.webhook_isolation import Site  # noqa: E402

UNCAPPED = {"REACTQ_WEBHOOK_TENANT_IN_FLIGHT": "10000", "REACTQ_WEBHOOK_HOST_IN_FLIGHT": "10000",
            "REACTQ_WEBHOOK_RETRY_THREADS": "8"}
Row = tuple[str, list[float], list[float], int]  # layout, idle delays, hostile delays, hanging receiver's calls


def one_layout(layout: str, args: argparse.Namespace, problems: list[str]) -> Row:
    from tests.fixtures_receiver import Receiver
    from worker.core.models import RunSpec

    arrived: dict[str, float] = {}

    def note(headers: dict[str, str], body: bytes) -> int:
        arrived[json.loads(body)["run_id"]] = time.time()
        return 200

    bench = Bench(args, Path(tempfile.mkdtemp(prefix=f"reactq-webhook-fairness-{layout}-")))
    hang, fast = Receiver(behaviour="hang").start(), Receiver(judge=note).start()
    try:
        site = Site(bench, args, shared=False, env=UNCAPPED if layout == "uncapped" else None)

        def b_delay() -> float:
            """Seconds from tenant b's run's end until its webhook arrived."""
            [run] = site.submit([RunSpec(question="What is 6 * 7?", tenant="b", webhook_url=fast.url)])
            deadline = time.monotonic() + 600
            while run.id not in arrived:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{layout}: tenant b's webhook did not arrive in 600 s")
                time.sleep(0.02)
            [loaded] = site.store.load_runs([run.id])
            if loaded is None or loaded.status.value != "succeeded":
                problems.append(f"{layout}: run {run.id} {loaded.status.value if loaded else 'gone'}")
                return 0.0
            return arrived[run.id] - (loaded.finished_at or 0.0)

        idle = [b_delay() for _ in range(args.repeats)]
        ids = [r.id for r in site.submit([RunSpec(question=f"What is {i} + 1?", tenant="a", webhook_url=hang.url)
                                          for i in range(args.hostile)])]
        deadline = time.monotonic() + 600
        while not all(r is not None and r.status.finished for r in site.store.load_runs(ids)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{layout}: tenant a's runs did not finish in 600 s")
            time.sleep(0.1)
        hostile: list[float] = []
        window_ends = time.monotonic() + args.window
        while len(hostile) < args.repeats or time.monotonic() < window_ends:
            hostile.append(b_delay())
            time.sleep(1)
        site.conn.release()
        return layout, idle, hostile, len(hang.calls)
    finally:
        hang.stop()
        fast.stop()
        bench.procs.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hostile", type=int, default=64, help="runs whose webhooks go to the hanging receiver")
    ap.add_argument("--concurrency", type=int, default=20, help="step threads of the worker")
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=40.0, help="seconds of timing b's webhooks while a's hang")
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped layout")
    ap.add_argument("--loglevel", default="WARNING")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # the tree under test
    problems: list[str] = []
    rows = [one_layout(layout, args, problems) for layout in ["capped"] + ([] if args.no_uncapped else ["uncapped"])]
    report = [f"{args.hostile} runs of tenant a whose webhooks go to a receiver that never answers (10 s attempt "
              f"deadline); tenant b's webhook timed for {args.window:g} s after a's runs all finished; webhook "
              f"worker of 8 threads, stub latency {args.latency_ms:g} ms", "",
              "| layout | b idle (median / max) | b with a's hanging (median / max) | b's webhooks timed | "
              "calls to the hanging receiver |", "|---|---|---|---|---|"]
    for layout, idle, hostile, calls in rows:
        report.append(f"| {layout} | {statistics.median(idle):.2f} / {max(idle):.2f} s | "
                      f"{statistics.median(hostile):.2f} / {max(hostile):.2f} s | {len(hostile)} | {calls} |")
    ok = max(rows[0][2]) <= 2.0
    report += ["", f"target (capped: tenant b's webhook within 2 s of its run's end): {'met' if ok else 'MISSED'}"]
    return finish(report, problems, ok, args.out)


if __name__ == "__main__":
    sys.exit(main())
