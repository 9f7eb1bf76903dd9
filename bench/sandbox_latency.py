"""Sandbox latency and sustained rate: warm containers against `docker run`, on runc and gVisor, in one run.

    python bench/sandbox_latency.py [--runs 200] [--cold-runs 20] [--gap-ms 20] [--tier standard] [--runtimes R,..]
    python bench/sandbox_latency.py --sustained 30 [--concurrency 50] [--tenants 10] [--runtimes ...] [--out F]

Each runtime gets a tiers file whose tier requires it (runc: the engine's default).
Default mode, per runtime: `docker run --rm --network none` of the image (`--runtime runsc` for
gVisor), `--cold-runs` times; then `--runs` back-to-back SandboxService.execute("print(6*7)") calls of
one tenant at low load (one caller): the warm path, from call to result (pool take, request, the
supervisor's prepared child runs the code, output, exit record). The supervisor's cleanup after a call
(ending with its ready record) is read after the call returned, so a call right behind another waits for it
in its pool take; then the same calls `--gap-ms` apart (a run's model call comes between its python calls),
where the cleanup is off the path. Beside them: the container's CPU a warm call, as the result reports it.
Targets: warm p50 <= 5 ms on runc, back to back (docs/decisions/warm-containers.md).

--sustained S, per runtime: C concurrent callers each run `print(6*7)` back to back for S seconds,
spread over T tenants, first through the warm pool (containers bound to a tenant serve it again),
then with `docker run --rm` (the same C callers, the same S seconds); executions/s, p50/p99 of both,
and the ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools_sandbox import SandboxService, SandboxSettings  # noqa: E402
from tools_sandbox.base.config import DEFAULT_TIERS_FILE  # noqa: E402
from tools_sandbox.base.tiers import requiring_runtime  # noqa: E402

SNIPPET = "print(6*7)"
def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def timed(fn, runs: int, pause_s: float = 0.0) -> list[float]:
    """Milliseconds of each of `runs` calls of fn, `pause_s` apart (the pauses are not timed)."""
    out = []
    for _ in range(runs):
        time.sleep(pause_s)
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


def tiers_for(runtime: str, workdir: Path) -> Path:
    """The shipped tiers, each requiring `runtime` (runc = the engine's default, the file unchanged)."""
    path = workdir / f"tiers-{runtime}.toml"
    path.write_text(requiring_runtime(DEFAULT_TIERS_FILE.read_text(encoding="utf-8"), runtime), encoding="utf-8")
    return path


def docker_run_argv(image: str, runtime: str) -> list[str]:
    return ["docker", "run", "--rm", "--network", "none", *(["--runtime", runtime] if runtime != "runc" else []),
            image, "python3", "-c", SNIPPET]


def service_for(args: argparse.Namespace, tiers_file: Path) -> SandboxService:
    return SandboxService(SandboxSettings(sandbox_tiers_file=tiers_file, sandbox_pool_tiers=args.tier,
                                          sandbox_pool_max=args.pool_max, sandbox_pool_builders=args.builders),
                          backend="docker", pool=True)


def check(result) -> None:
    if result.stdout != "42\n":
        raise RuntimeError(f"unexpected result: {result}")


def run_sustained(args: argparse.Namespace, image: str, runtime: str, tiers_file: Path) -> list[str]:
    rows = []
    with service_for(args, tiers_file) as service:
        assert service.pool is not None, service.start_error
        service.pool.wait_ready(120)

        def pool_call(i: int) -> None:
            check(service.execute(SNIPPET, tier=args.tier, tenant=f"tenant-{i % args.tenants}"))

        rows.append((f"{runtime}: warm pool (SandboxService.execute)",
                     *sustained(pool_call, args.sustained, args.concurrency)))
        stats = (f"cold starts {service.pool.cold_starts}, reuses {service.pool.reuses}, "
                 f"retired {dict(service.pool.retired)}")
    argv = docker_run_argv(image, runtime)

    def docker_run(i: int) -> None:
        out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout
        if out != "42\n":
            raise RuntimeError(f"unexpected output {out!r}")

    rows.append((f"{runtime}: `{' '.join(argv[:-3])}`", *sustained(docker_run, args.sustained, args.concurrency)))
    lines = []
    for name, n, elapsed, lat in rows:
        lines.append(f"| {name} | {n} | {elapsed:.1f} | {n / elapsed:.2f} | {statistics.median(lat):.1f} | "
                     f"{pct(lat, 99):.1f} |")
    ratio = (rows[0][1] / rows[0][2]) / (rows[1][1] / rows[1][2])
    lines.append(f"| {runtime}: **pool / docker run** | | | **{ratio:.1f}x** | | |")
    print("\n".join(lines), f"\n({runtime} pool: {stats})", flush=True)
    return lines


def run_latency(args: argparse.Namespace, image: str, runtime: str, tiers_file: Path) -> list[str]:
    argv = docker_run_argv(image, runtime)
    rows = [(f"{runtime}: `{' '.join(argv[:-3])}`, n={args.cold_runs}",
             timed(lambda: subprocess.run(argv, check=True, capture_output=True), args.cold_runs))]
    with service_for(args, tiers_file) as service:
        assert service.pool is not None, service.start_error
        service.pool.wait_ready(120)

        container_cpu: list[float] = []

        def warm_call() -> None:
            result = service.execute(SNIPPET, tier=args.tier, tenant="bench")
            check(result)
            if result.cpu_seconds is not None:
                container_cpu.append(result.cpu_seconds * 1000)

        warm_call()  # binds the tenant's container
        container_cpu.clear()
        rows.append((f"{runtime}: warm `print(6*7)`, one tenant, one caller, tier {args.tier}, n={args.runs}",
                     timed(warm_call, args.runs)))
        if args.gap_ms:
            rows.append((f"{runtime}: the same, {args.gap_ms:g} ms between calls, n={args.runs}",
                         timed(warm_call, args.runs, args.gap_ms / 1000)))
        stats = f"cold starts {service.pool.cold_starts}, reuses {service.pool.reuses}"
        if container_cpu:
            stats += (f"; the container's CPU a warm call (its cgroup, exit record to exit record: the program, "
                      f"the supervisor, the cleanup after it): median {statistics.median(container_cpu):.2f} ms")
    lines = [f"| {name} | {statistics.median(samples):.1f} | {pct(samples, 99):.1f} | "
             f"{statistics.fmean(samples):.1f} | {min(samples):.1f} | {max(samples):.1f} |" for name, samples in rows]
    print("\n".join(lines), f"\n({runtime} pool: {stats})", flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--cold-runs", type=int, default=20)
    ap.add_argument("--tier", default="standard")
    ap.add_argument("--gap-ms", type=float, default=20, help="the warm calls again, this far apart (0: not)")
    ap.add_argument("--runtimes", default="runc,runsc")
    ap.add_argument("--out", default=None, help="write a markdown report here")
    ap.add_argument("--sustained", type=float, default=0, help="seconds of the sustained-throughput mode")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--pool-max", type=int, default=16)
    ap.add_argument("--builders", type=int, default=3)
    args = ap.parse_args()
    image = SandboxSettings().sandbox_image
    if args.sustained:
        header = ["| what | executions | seconds | executions/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|---:|"]
        measure = run_sustained
        what = (f"{args.concurrency} callers over {args.tenants} tenants, tier {args.tier}, "
                f"{args.sustained:.0f} s each")
    else:
        header = ["| what | p50 ms | p99 ms | mean ms | min ms | max ms |", "|---|---:|---:|---:|---:|---:|"]
        measure = run_latency
        what = f"tier {args.tier}"
    lines = list(header)
    with tempfile.TemporaryDirectory() as workdir:
        for runtime in args.runtimes.split(","):
            lines += measure(args, image, runtime, tiers_for(runtime, Path(workdir)))
    table = "\n".join(lines)
    print(f"\n{table}\n\n{what}")
    if args.out:
        command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
        engine = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                capture_output=True, text=True).stdout.strip()
        Path(args.out).write_text(f"# Sandbox latency\n\nCommand: `{command}`\n\nMachine: {platform.platform()}, "
                                  f"{os.cpu_count()} cores; Docker engine {engine}; image `{image}`.\n\n"
                                  f"{table}\n\n{what}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
