"""Batches of any size: the CLI's peak RSS and the Redis bytes a finished run keeps, at 10,000 and
100,000 lines, measured in one invocation against a baseline checkout.

    python bench/batch_scale.py [--sizes 10000,100000] [--commands batch,eval] [--src TREE]
                                [--baseline-src TREE] [--baseline-sizes 10000]

For each (source tree, command, size): a fresh redis-server (no persistence) and stub (latency 0) on free
ports, `reactq worker --queues steps --processes P` from that tree, then `reactq batch IN --out OUT` (or
`reactq eval IN --out OUT --json`, each line carrying `expected`: A * B + C) from that tree with N lines
"What is A * B + C?" (calculator then final answer: two steps, one tool call each).
- CLI peak RSS: VmHWM of the `reactq batch` / `reactq eval` process itself (/proc/self/status at its exit).
- Redis per finished run: every key of 200 sampled runs, found by one SCAN, sized with MEMORY USAGE
  (bytes and key count per run); and INFO used_memory after the batch minus before it, divided by N
  (everything: run keys, batch keys, queues drained).
Targets: peak RSS(100k) - peak RSS(10k) < 20 MB for each command; bytes per finished run <= half the
baseline's (the baseline is measured with `batch`).
Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import Procs, free_port, http_json  # noqa: E402


class TreeProcs(Procs):
    """Processes started in the log directory, not the repo: `python -m worker...` must import the tree
    on PYTHONPATH (the baseline's or ours), not whatever the working directory holds."""

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, cwd=self.logdir, env={**os.environ, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

# VmHWM, not ru_maxrss: ru_maxrss survives exec, so a CLI forked from this (by then large) script reported
# the script's own RSS when that was higher (297 MB for `reactq batch` after an eval of 100,000 lines).
LAUNCH = ("import atexit, sys\n"
          "def hwm():\n"
          "    for line in open('/proc/self/status'):\n"
          "        if line.startswith('VmHWM:'):\n"
          "            return int(line.split()[1])\n"
          "atexit.register(lambda: print('MAXRSS_KB', hwm(), file=sys.stderr))\n"
          "sys.argv = ['reactq', *sys.argv[1:]]\n"
          "from worker.cli.main import main\nmain()\n")


@dataclass
class Measure:
    src: str
    command: str
    lines: int
    seconds: float
    cli_peak_rss_mb: float
    run_bytes: float
    run_keys: float
    used_memory_per_run: float
    succeeded: int
    correct: int | None  # eval: lines scored correct


def start_redis(procs: Procs) -> str:
    import redis

    port = free_port()
    procs.start("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--maxclients", "10000", "--protected-mode", "no"])
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    client.close()
    return f"redis://127.0.0.1:{port}/0"


def per_run_bytes(redis_url: str, run_ids: list[str]) -> tuple[float, float]:
    import redis

    client = redis.Redis.from_url(redis_url)
    wanted = set(run_ids)
    sizes: dict[str, list[int]] = {i: [] for i in run_ids}
    for key in client.scan_iter(match="reactq:run:*", count=5000):
        run_id = key.decode().split(":")[2]
        if run_id in wanted:
            sizes[run_id].append(int(client.memory_usage(key, samples=0) or 0))
    client.close()
    return (sum(sum(v) for v in sizes.values()) / len(sizes), sum(len(v) for v in sizes.values()) / len(sizes))


def measure(src: Path, command: str, lines: int, processes: int, workdir: Path) -> Measure:
    import redis

    logdir = workdir / f"{src.name}-{command}-{lines}"
    logdir.mkdir(parents=True)
    procs = TreeProcs(logdir)
    env = {"PYTHONPATH": str(src), "REACTQ_METRICS_PORT": "0"}
    try:
        redis_url = start_redis(procs)
        stub_port = free_port()
        procs.start("stub", [sys.executable, "-m", "worker.cli", "stub", "--port", str(stub_port)], env=env)
        for _ in range(300):
            try:
                http_json(f"http://127.0.0.1:{stub_port}/healthz")
                break
            except OSError:
                time.sleep(0.05)
        env.update({"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"http://127.0.0.1:{stub_port}/v1"})
        procs.start("workers", [sys.executable, "-m", "worker.cli", "worker", "--queues", "steps", "--processes",
                                str(processes), "--concurrency", "64", "--metrics-port", "0"], env=env)
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 120
        while client.zcount("reactq:workers:reactq.steps", time.time() - 30, "+inf") < processes:
            if time.monotonic() > deadline:
                raise RuntimeError("workers not ready:\n" + procs.log("workers")[-3000:])
            time.sleep(0.2)
        rng = random.Random(lines)
        infile, outfile = logdir / "in.jsonl", logdir / "out.jsonl"
        with infile.open("w") as f:
            for i in range(lines):
                a, b, c = rng.randint(2, 999), rng.randint(2, 999), rng.randint(1, 99)
                line = {"id": f"q{i}", "question": f"What is {a} * {b} + {c}?"}
                if command == "eval":
                    line["expected"] = str(a * b + c)
                f.write(json.dumps(line) + "\n")
        before = int(client.info("memory")["used_memory"])
        t0 = time.monotonic()
        argv = [command, str(infile), "--out", str(outfile)] + (["--json"] if command == "eval" else [])
        done = subprocess.run([sys.executable, "-c", LAUNCH, *argv],
                              cwd=logdir, env={**os.environ, **env}, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        (logdir / "cli.log").write_text(done.stderr)
        (logdir / "cli.out").write_text(done.stdout)
        if done.returncode != 0:
            raise RuntimeError(f"reactq {command} exited {done.returncode}:\n{done.stderr[-3000:]}")
        rss_kb = int(done.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
        time.sleep(2)  # the last runs' after-finish work (a worker trims right after committing)
        used = int(client.info("memory")["used_memory"]) - before
        results = [json.loads(t) for t in outfile.read_text().splitlines()]
        sample = [r["run_id"] for r in rng.sample(results, min(200, len(results)))]
        run_bytes, run_keys = per_run_bytes(redis_url, sample)
        client.close()
        return Measure(src=str(src), command=command, lines=lines, seconds=round(seconds, 1),
                       cli_peak_rss_mb=round(rss_kb / 1024, 1),
                       run_bytes=round(run_bytes), run_keys=round(run_keys, 2),
                       used_memory_per_run=round(used / lines),
                       succeeded=sum(r["status"] == "succeeded" for r in results),
                       correct=sum(bool(r.get("correct")) for r in results) if command == "eval" else None)
    finally:
        procs.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--baseline-src", default=None, help="a checkout of the code before this change")
    parser.add_argument("--baseline-sizes", default="10000")
    parser.add_argument("--commands", default="batch", help="batch, eval, or both (batch,eval)")
    parser.add_argument("--src", default=str(ROOT), help="the tree to measure (default: this checkout)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the services it started are stopped
    workdir = Path(tempfile.mkdtemp(prefix="reactq-batch-scale-"))
    runs: list[Measure] = []
    if args.baseline_src:
        for n in map(int, args.baseline_sizes.split(",")):
            runs.append(measure(Path(args.baseline_src).resolve(), "batch", n, args.processes, workdir))
            print(json.dumps(asdict(runs[-1])), flush=True)
    src = Path(args.src).resolve()
    for command in args.commands.split(","):
        for n in map(int, args.sizes.split(",")):
            runs.append(measure(src, command, n, args.processes, workdir))
            print(json.dumps(asdict(runs[-1])), flush=True)
    base = [m for m in runs if m.src != str(src)]
    verdicts = []
    for command in args.commands.split(","):
        ours = {m.lines: m for m in runs if m.src == str(src) and m.command == command}
        if len(ours) >= 2:
            small, large = ours[min(ours)], ours[max(ours)]
            growth = large.cli_peak_rss_mb - small.cli_peak_rss_mb
            verdicts.append((f"reactq {command}: CLI peak RSS grows {growth:.1f} MB from {small.lines} to "
                             f"{large.lines} lines (< 20)", growth < 20))
    ours = {m.lines: m for m in runs if m.src == str(src) and m.command == "batch"}
    if base and ours:
        ratio = ours[min(ours)].run_bytes / base[0].run_bytes
        verdicts.append((f"a finished run keeps {ours[min(ours)].run_bytes:.0f} B in {ours[min(ours)].run_keys} keys, "
                         f"{ratio:.2f} x the baseline's {base[0].run_bytes:.0f} B in {base[0].run_keys} keys (<= 0.5)",
                         ratio <= 0.5))
    for text, ok in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(m) for m in runs], indent=2))
    print(f"logs: {workdir}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
