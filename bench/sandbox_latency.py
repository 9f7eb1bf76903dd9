"""Sandbox latency: `docker run`, `docker exec` and the warm pool, measured in one run.

    python bench/sandbox_latency.py [--runs 200] [--cold-runs 20] [--tier standard] [--out FILE]
    python bench/sandbox_latency.py --sustained 30 [--concurrency 50] [--tenants 10] [--out FILE]

--sustained S: C concurrent callers each run `print(6*7)` back to back for S seconds, spread over T
tenants, first through the warm pool (SandboxService.execute, one container per execution), then
with `docker run --rm` (the same C callers, the same S seconds), and reports executions/s and
p50/p99 of both, and the ratio.

End-to-end pool figure = SandboxService.execute("print(6*7)") from call to result
(pool take, request, fork+exec in the agent, output, exit record); the container's
destruction and replacement happen in the background and are not on that path.
Between pool runs the script waits for the pool to be full again (not timed), so the
figure is the warm path; the replacement cost is reported separately (it bounds the
sustained rate per tier, per worker process).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools_sandbox import SandboxService, SandboxSettings  # noqa: E402

SNIPPET = "print(6*7)"


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def sustained(fn: Callable[[int], None], seconds: float, concurrency: int) -> tuple[int, float, list[float]]:
    """`concurrency` threads call fn(i) back to back for `seconds`: (calls finished, elapsed s, latencies ms)."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + seconds
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        while time.perf_counter() < stop_at and not errors:
            t0 = time.perf_counter()
            try:
                fn(i)
            except BaseException as exc:  # noqa: BLE001 - reported after the run
                errors.append(exc)
                return
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a call failed: {errors[0]!r}")
    return len(latencies), time.perf_counter() - start, latencies


def run_sustained(args: argparse.Namespace, image: str) -> None:
    settings = SandboxSettings(sandbox_pool_tiers=args.tier, sandbox_pool_max=args.pool_max,
                               sandbox_pool_builders=args.builders)
    rows = []
    with SandboxService(settings, backend="docker", pool=True) as service:
        assert service.pool is not None
        service.pool.wait_ready(120)

        def pool_call(i: int) -> None:
            r = service.execute(SNIPPET, tier=args.tier, tenant=f"tenant-{i % args.tenants}")
            if r.stdout != "42\n":
                raise RuntimeError(f"unexpected result: {r}")

        rows.append(("warm pool (SandboxService.execute)", *sustained(pool_call, args.sustained, args.concurrency)))
        cold = service.pool.cold_starts

    def docker_run(i: int) -> None:
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", SNIPPET],
                             check=True, capture_output=True, text=True).stdout
        if out != "42\n":
            raise RuntimeError(f"unexpected output {out!r}")

    rows.append(("`docker run --rm --network none`", *sustained(docker_run, args.sustained, args.concurrency)))
    lines = ["| what | executions | seconds | executions/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, n, elapsed, lat in rows:
        lines.append(f"| {name} | {n} | {elapsed:.1f} | {n / elapsed:.2f} | {statistics.median(lat):.1f} | "
                     f"{pct(lat, 99):.1f} |")
    ratio = (rows[0][1] / rows[0][2]) / (rows[1][1] / rows[1][2])
    table = "\n".join(lines)
    report = (f"{table}\n\nsustained rate, pool / docker run = {ratio:.2f}; cold starts during the pool run: {cold}; "
              f"{args.concurrency} callers over {args.tenants} tenants, tier {args.tier}, {args.sustained:.0f} s each")
    print(report)
    if args.out:
        command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
        Path(args.out).write_text(f"# Sandbox sustained throughput\n\nCommand: `{command}`\n\n"
                                  f"Machine: {platform.platform()}, {os.cpu_count()} cores.\n\n{report}\n",
                                  encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--cold-runs", type=int, default=20)
    ap.add_argument("--tier", default="standard")
    ap.add_argument("--out", default=None, help="write a markdown report here")
    ap.add_argument("--sustained", type=float, default=0, help="seconds of the sustained-throughput mode")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--pool-max", type=int, default=16)
    ap.add_argument("--builders", type=int, default=3)
    args = ap.parse_args()
    if args.sustained:
        run_sustained(args, SandboxSettings().sandbox_image)
        return

    settings = SandboxSettings(sandbox_pool_tiers=args.tier)
    image = settings.sandbox_image
    rows: list[tuple[str, list[float]]] = []

    def docker_run() -> None:
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", SNIPPET],
                       check=True, capture_output=True)

    rows.append((f"`docker run --rm --network none` (CLI), n={args.cold_runs}", timed(docker_run, args.cold_runs)))

    cid = subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", image, "sleep", "infinity"],
                         check=True, capture_output=True, text=True).stdout.strip()
    try:
        def docker_exec() -> None:
            subprocess.run(["docker", "exec", cid, "python3", "-c", SNIPPET], check=True, capture_output=True)

        rows.append((f"`docker exec` into a running container (CLI), n={args.runs // 2}",
                     timed(docker_exec, args.runs // 2)))

        import docker

        client = docker.from_env()

        def sdk_exec() -> None:
            exec_id = client.api.exec_create(cid, ["python3", "-c", SNIPPET])["Id"]
            client.api.exec_start(exec_id)

        rows.append((f"SDK exec_create+exec_start (unix socket), n={args.runs // 2}",
                     timed(sdk_exec, args.runs // 2)))
        client.close()
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)

    with SandboxService(settings, backend="docker", pool=True) as service:
        assert service.pool is not None
        service.pool.wait_ready(120)
        warm: list[float] = []
        refill: list[float] = []
        for _ in range(args.runs):
            service.pool.wait_ready(120)
            t0 = time.perf_counter()
            r = service.execute(SNIPPET, tier=args.tier)
            warm.append((time.perf_counter() - t0) * 1000)
            if r.stdout != "42\n":
                raise SystemExit(f"unexpected result: {r}")
            t1 = time.perf_counter()
            service.pool.wait_ready(120)
            refill.append((time.perf_counter() - t1) * 1000)
        cold_starts = service.pool.cold_starts
        rows.append((f"pool end-to-end `print(6*7)`, tier {args.tier}, n={args.runs}", warm))
        rows.append(("pool replacement (create+attach+start, background), same runs", refill))

    header = "| what | p50 ms | p99 ms | mean ms | min ms | max ms |\n|---|---:|---:|---:|---:|---:|"
    lines = [header]
    for name, samples in rows:
        lines.append(f"| {name} | {statistics.median(samples):.1f} | {pct(samples, 99):.1f} | "
                     f"{statistics.fmean(samples):.1f} | {min(samples):.1f} | {max(samples):.1f} |")
    table = "\n".join(lines)
    print(table)
    print(f"cold starts during the pool runs: {cold_starts}")
    if args.out:
        command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
        info = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              capture_output=True, text=True).stdout.strip()
        Path(args.out).write_text(
            "# Sandbox latency\n\n"
            f"Command: `{command}`\n\n"
            f"Machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
            f"{__import__('os').cpu_count()} cores; Docker engine {info}; image `{image}`.\n\n"
            f"{table}\n\n"
            f"Cold starts during the pool runs: {cold_starts}. The pool figure is the warm path: the\n"
            "script waits (untimed) for the pool to refill between runs; the replacement row is what\n"
            "each execution costs in the background and bounds the sustained rate per tier and worker\n"
            "process (about 1000 / replacement-p50 executions per second before callers see cold starts).\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
