"""The shared limiter against a provider that enforces its per-minute limit in fixed 2-second windows.

    python bench/limiter_windows.py [--runs 100] [--modes window,none,none-burst3] [--out FILE]

For each mode, a fresh redis-server, `reactq stub` enforcing 240 requests/min as 8 per 2-second window
aligned to the clock (`limit_window_s`, 50 ms per call), and 3 `reactq worker --queues steps
--concurrency 16` processes told `rpm: 200` for the model. R runs ("What is A * B + C?", two LLM calls each)
are submitted at once; when all have finished the stub's own record of what it admitted and refused gives:
calls, 429s, the most calls any one window admitted, and the busy rate (calls per minute between the stub's
admissions, leaving out the first 5% and the last 10%: the workers' first steps and the batch's tail).
The waits are the workers' `reactq_llm_limiter_wait_seconds` (slept for a reserved slot and held by the
window guard), p50/p95 interpolated within its buckets; calls re-queued for a later slot are not in it.

Modes: `default` (no `window_s`: even spacing), `window` (`window_s: 2`, the provider's window), `none`
(`window_s: 0`, the limiter as it was, burst tolerance 0.5 s), `none-burst3` (`window_s: 0`,
REACTQ_LLM_LIMIT_BURST_S=3).
Target: in `window`, 0 429s and a busy rate >= 90% of 200/min. Exit 1 if missed, 2 on a failed run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import Bench, finish, free_port, http_json  # noqa: E402

REACTQ = [sys.executable, "-m", "worker.cli"]  # this tree's reactq (the procs run in its root)

PROVIDER_RPM, WINDOW_S, LIMIT_RPM = 240, 2, 200
MODES = {
    "default": ({"rpm": LIMIT_RPM}, {}),  # no window_s: calls one interval apart, admitted and sent
    "window": ({"rpm": LIMIT_RPM, "window_s": WINDOW_S}, {}),
    "none": ({"rpm": LIMIT_RPM, "window_s": 0}, {}),
    "none-burst3": ({"rpm": LIMIT_RPM, "window_s": 0}, {"REACTQ_LLM_LIMIT_BURST_S": "3"}),
}


def busy_rate(admitted: list[float]) -> float:
    ordered = sorted(admitted)
    body = ordered[len(ordered) // 20: len(ordered) - len(ordered) // 10]
    return 60 * (len(body) - 1) / (body[-1] - body[0]) if len(body) > 1 else 0.0


def most_in_a_window(admitted: list[float]) -> int:
    counts: dict[int, int] = {}
    for t in admitted:
        counts[math.floor(t / WINDOW_S)] = counts.get(math.floor(t / WINDOW_S), 0) + 1
    return max(counts.values(), default=0)


def wait_quantiles(texts: list[str], model: str = "reactq-stub") -> tuple[float, float, int]:
    """p50 and p95 of the workers' limiter-wait histogram (summed), linear within buckets; and its count."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name != "reactq_llm_limiter_wait_seconds":
                continue
            for s in family.samples:
                if s.name.endswith("_bucket") and s.labels.get("model") == model:
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
    bounds = sorted(buckets)
    count = buckets.get(math.inf, 0.0)

    def quantile(q: float) -> float:
        rank, lower, below = q * count, 0.0, 0.0
        for le in bounds:
            if buckets[le] >= rank:
                if math.isinf(le):
                    return lower
                share = (rank - below) / (buckets[le] - below) if buckets[le] > below else 1.0
                return lower + share * (le - lower)
            lower, below = le, buckets[le]
        return lower

    return (quantile(0.5), quantile(0.95), int(count)) if count else (0.0, 0.0, 0)


def held_back(texts: list[str], model: str = "reactq-stub") -> dict[str, int]:
    """The workers' reactq_llm_throttled_total by reason, summed."""
    from prometheus_client.parser import text_string_to_metric_families

    reasons: dict[str, int] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name == "reactq_llm_throttled":
                for s in family.samples:
                    if s.name.endswith("_total") and s.labels.get("model") == model:
                        reasons[s.labels["reason"]] = reasons.get(s.labels["reason"], 0) + int(s.value)
    return dict(sorted(reasons.items()))


def run_mode(args: argparse.Namespace, mode: str, logdir: Path, problems: list[str]) -> str:
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

    model, extra_env = MODES[mode]
    bench = Bench(args, logdir / mode)
    (logdir / mode).mkdir(parents=True)
    rng = random.Random(11)
    try:
        redis_url = bench.start_redis()
        stub_url = bench.start_stub(50, faults={"rpm_limit": PROVIDER_RPM, "limit_window_s": WINDOW_S})
        env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
               "REACTQ_MODELS": json.dumps({"reactq-stub": model}), "REACTQ_STALE_AFTER_S": "600", **extra_env}
        names, ports = [f"reactq-{i}" for i in range(3)], [free_port() for _ in range(3)]
        for name, metrics in zip(names, ports, strict=True):
            bench.procs.start(name, [*REACTQ, "worker", "--queues", "steps", "--concurrency", "16",
                                     "--metrics-port", str(metrics), "--loglevel", "WARNING"], env)
        bench.wait_ready(names, redis_url)
        settings = Settings(redis_url=redis_url)
        store = RunStore(connect(redis_url, 16), settings.run_ttl_s)
        tenants, budgets = Tenants(TenantStore(store.r), settings), TenantBudgets(SpendStore(store.r))
        client = Celery("bench_limiter_client", broker=redis_url)
        conn = client.connection_for_write()

        def send_step(run_id: str, index: int, priority: int | None = None) -> None:
            client.send_task("reactq.step", args=[run_id, index], queue="reactq.steps", connection=conn,
                             priority=priority)

        specs = [RunSpec(question=f"What is {rng.randint(100, 99999)} * {rng.randint(100, 99999)} + "
                                  f"{rng.randint(1, 9999)}?") for _ in range(args.runs)]
        started = time.monotonic()
        runs = submit(store, specs, settings, send_step, batch_id=new_batch_id(), tenants=tenants,
                      budgets=budgets)
        ids = [r.id for r in runs]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            loaded = store.load_runs(ids)
            if all(r is not None and r.status.finished for r in loaded):
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        failed = [r.id for r in store.load_runs(ids) if r is None or r.status.value != "succeeded"]
        if failed:
            problems.append(f"{mode}: {len(failed)} runs did not succeed")
        seen = http_json(f"{stub_url}/stub/stats/arrivals", timeout=30)
        (logdir / mode / "arrivals.json").write_text(json.dumps(seen))
        import urllib.request

        texts = [urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10).read().decode()
                 for p in ports]
        p50, p95, waited = wait_quantiles(texts)
        admitted, refused = seen["admitted"], seen["refused"]
        rate = busy_rate(admitted)
        conn.release()
        return (f"| {mode} | {json.dumps(model)} {' '.join(f'{k}={v}' for k, v in extra_env.items())} | "
                f"{args.runs} | {len(admitted)} | {len(refused)} | {most_in_a_window(admitted)} | {rate:.1f} | "
                f"{rate / LIMIT_RPM:.1%} | {p50:.3f} / {p95:.3f} ({waited}) | {held_back(texts)} | {elapsed:.1f} |")
    finally:
        bench.procs.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--modes", default="window,none,none-burst3")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="reactq-limiter-"))
    problems: list[str] = []
    rows = [run_mode(args, mode, logdir, problems) for mode in args.modes.split(",")]
    report = [f"provider: {PROVIDER_RPM}/min as {PROVIDER_RPM * WINDOW_S // 60} per {WINDOW_S} s window; "
              f"reactq: {LIMIT_RPM}/min; 3 workers x 16 threads; logs in {logdir}", "",
              "| mode | model / env | runs | calls admitted | 429s | most in one window | busy rate /min | "
              "of 200 | limiter wait p50 / p95 s (calls) | held back, by reason | wall s |",
              "|---|---|---|---|---|---|---|---|---|---|---|", *rows]
    window = next((r for r in rows if r.startswith("| window |")), None)
    ok = True
    if window is not None:
        cells = [c.strip() for c in window.split("|")]
        ok = cells[5] == "0" and float(cells[7]) >= 0.9 * LIMIT_RPM
        report += ["", f"target (window: 0 429s, busy rate >= 90% of {LIMIT_RPM}/min): {'met' if ok else 'MISSED'}"]
    return finish(report, problems, ok, args.out)


if __name__ == "__main__":
    sys.exit(main())
