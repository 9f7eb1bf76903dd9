"""Sandbox latency: `docker run`, `docker exec` and the warm pool, measured in one run.

    python bench/sandbox_latency.py [--runs 200] [--cold-runs 20] [--tier standard] [--out FILE]

End-to-end pool figure = SandboxService.execute("print(6*7)") from call to result
(pool take, request, fork+exec in the agent, output, exit record); the container's
destruction and replacement happen in the background and are not on that path.
Between pool runs the script waits for the pool to be full again (not timed), so the
figure is the warm path; the replacement cost is reported separately (it bounds the
sustained rate per tier, per worker process).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import subprocess
import sys
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--cold-runs", type=int, default=20)
    ap.add_argument("--tier", default="standard")
    ap.add_argument("--out", default=None, help="write a markdown report here")
    args = ap.parse_args()

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
