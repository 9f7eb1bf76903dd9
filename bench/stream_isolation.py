"""Event streams against another tenant's requests: how long tenant B's `GET /v1/usage` takes while
tenant A holds N event streams open on one `reactq api` process, against the same requests with no
stream open (the baseline, in the same run).

    python bench/stream_isolation.py [--streams 8] [--pool 8] [--requests 40] [--src TREE]

A fresh redis-server and `reactq api` (from TREE, default this one) with REACTQ_REDIS_MAX_CONNECTIONS=POOL
and REACTQ_SSE_MAX_STREAMS_PER_PROCESS=STREAMS; tenants `streamer` and `bystander` (plan standard) with a
key each; STREAMS runs of `streamer`, queued (no worker), each followed by one open stream. Reported:
B's median and worst latency with and without the streams, their ratio, and B's non-200 answers.
Target: no non-200 answer, and a median ratio under 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import free_port  # noqa: E402


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(url)


def timed(client: httpx.Client, count: int) -> tuple[list[float], list[int]]:
    """Latencies of `count` GET /v1/usage, and the statuses that were not 200."""
    seconds, failed = [], []
    for _ in range(count):
        start = time.perf_counter()
        response = client.get("/v1/usage", timeout=60)
        seconds.append(time.perf_counter() - start)
        if response.status_code != 200:
            failed.append(response.status_code)
    return seconds, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--src", type=Path, default=ROOT)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reactq-streams-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port, api_port = free_port(), free_port()
        procs.append(subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port),
                                       "--save", "", "--appendonly", "no", "--dir", str(work)],
                                      stdout=subprocess.DEVNULL))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")},
               "REACTQ_REDIS_URL": f"redis://127.0.0.1:{port}/0", "REACTQ_REDIS_MAX_CONNECTIONS": str(args.pool),
               "REACTQ_SSE_MAX_STREAMS_PER_PROCESS": str(args.streams), "PYTHONUNBUFFERED": "1"}
        time.sleep(0.5)
        keys = {}
        for tenant in ("streamer", "bystander"):
            reactq = [sys.executable, "-m", "worker.cli"]
            subprocess.run([*reactq, "tenant", "add", tenant, "--plan", "standard"], cwd=args.src, env=env,
                           check=True, capture_output=True)
            created = subprocess.run([*reactq, "key", "create", tenant, "--json"], cwd=args.src, env=env,
                                     check=True, capture_output=True, text=True)
            keys[tenant] = json.loads(created.stdout.strip().splitlines()[-1])["key"]
        procs.append(subprocess.Popen([sys.executable, "-m", "worker.cli", "api", "--port", str(api_port)],
                                      cwd=args.src, env=env, stdout=(work / "api.log").open("wb"),
                                      stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{api_port}"
        wait_http(f"{url}/healthz")
        streamer = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['streamer']}"},
                                limits=httpx.Limits(max_connections=args.streams + 4))
        bystander = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['bystander']}"})
        runs = [streamer.post("/v1/runs", json={"question": "What is 2 + 2?"}).json()["run_id"]
                for _ in range(args.streams)]
        timed(bystander, 5)  # warm up
        base, base_failed = timed(bystander, args.requests)
        with ExitStack() as stack:
            held = []  # each stream's line iterator: dropping one would close its stream
            for run_id in runs:
                response = stack.enter_context(streamer.stream("GET", f"/v1/runs/{run_id}/events", timeout=120))
                assert response.status_code == 200, response.read()
                held.append(response.iter_lines())
                next(line for line in held[-1] if line.startswith("event: "))
            loaded, loaded_failed = timed(bystander, args.requests)
        ratio = statistics.median(loaded) / statistics.median(base)
        print(f"/v1/usage of another tenant, {args.requests} requests, pool {args.pool}, src {args.src}")
        print(f"  no stream open:    median {statistics.median(base) * 1000:8.1f} ms, worst "
              f"{max(base) * 1000:8.1f} ms, non-200: {base_failed}")
        print(f"  {args.streams} streams open:   median {statistics.median(loaded) * 1000:8.1f} ms, worst "
              f"{max(loaded) * 1000:8.1f} ms, non-200: {loaded_failed}")
        print(f"  median ratio: {ratio:.2f}")
        return 0 if not loaded_failed and ratio < 3 else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(15)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
