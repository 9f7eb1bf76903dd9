"""Where a run's CPU goes: CPU seconds per run of every process a batch keeps busy, per kind of run.

    python bench/cpu_per_run.py [--runs 200] [--kinds calculator,python] [--runtime runc] [--out FILE]
                                [--step-worker-args '-P solo']

Per kind, on a fresh redis-server and `reactq stub` (latency 0): one step worker (`reactq worker --queues steps
-c 16`) and one sandbox worker (`--queues sandbox -c 16`, Docker backend, warm pool of tier standard), then
10 `reactq batch` at once, one per tenant, N runs in all. `calculator`: "What is A * B + C?" with fresh
numbers (2 steps: the calculator, the answer). `python`: "Run this python code: print(A*B)" (2 steps: a
sandbox execution, the answer). Every run must succeed with the right number in its answer.

CPU seconds (user + system, from /proc; bench/proc_cpu.py) between the batch's start and its end, per run and
per step, of: the step worker and the processes it started (webhook process, tool processes), the sandbox
worker and its children, the batch CLI (with its children), redis-server, the model server (the stub), dockerd,
containerd, the containerd shims, the containers (supervisor and executions), and what the machine spent
beyond all of these (`other`: other load on a shared machine included). The load average is printed with
the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_cpu import Proc, cpu_by_group, descendants, machine_busy_s, snapshot  # noqa: E402
from bench.sandbox_agent_path import IMAGE, tiers_file, wait_pool  # noqa: E402
from bench.throughput import BIN, Bench  # noqa: E402

os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

GROUPS = ("step worker", "step worker's children", "sandbox worker", "sandbox worker's children", "batch CLI",
          "redis-server", "model server (stub)", "dockerd", "containerd", "shims", "containers", "other")


def questions(kind: str, n: int) -> list[tuple[str, str]]:
    """(question, the number its answer must hold) for each run."""
    rng = random.Random(7)
    out = []
    for _ in range(n):
        a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(1, 99)
        if kind == "calculator":
            out.append((f"What is {a} * {b} + {c}?", str(a * b + c)))
        else:
            out.append((f"Run this python code:\n```python\nprint({a}*{b})\n```", str(a * b)))
    return out


def container_pids(owner_pid: int) -> set[int]:
    """The init pids of the running containers of the sandbox worker `owner_pid` (not other users' containers)."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=reactq.sandbox=1"], capture_output=True,
                         text=True).stdout.split()
    if not ids:
        return set()
    fields = '{{.State.Pid}} {{index .Config.Labels "reactq.sandbox.owner"}}'
    out = subprocess.run(["docker", "inspect", "--format", fields, *ids], capture_output=True, text=True).stdout
    return {int(pid) for pid, _, owner in (line.partition(" ") for line in out.splitlines())
            if f"/{owner_pid}/" in owner and pid.isdigit() and int(pid) > 0}


def grouper(roots: dict[str, int], containers: set[int], procs: dict[int, Proc]) -> Callable[[Proc], str | None]:
    """group_of(proc) for cpu_by_group on the snapshot `procs`: our processes by role, the engine's by name
    (each process tree is walked once here, not once per process)."""
    children = {role: descendants(procs, {roots[role]}) - {roots[role]} for role in ("step worker", "sandbox worker")}
    in_containers = descendants(procs, containers)
    shims = {procs[c].ppid for c in containers if c in procs}

    def group_of(p: Proc) -> str | None:
        for role, pids in children.items():
            if p.pid == roots[role]:
                return role
            if p.pid in pids:
                return f"{role}'s children"
        if p.pid == roots["redis-server"]:
            return "redis-server"
        if p.pid == roots["model server (stub)"]:
            return "model server (stub)"
        if p.name in ("dockerd", "containerd"):
            return p.name
        if p.pid in in_containers:
            return "containers"
        if p.name.startswith("containerd-shim") and p.pid in shims:
            return "shims"
        return None

    return group_of


def measure(bench: Bench, args: argparse.Namespace, kind: str, workdir: Path) -> dict[str, object]:
    redis_url = bench.start_redis()
    stub_url = bench.start_stub(0)
    tenants = [f"t{i:02d}" for i in range(10)]
    env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
           "REACTQ_TENANTS": json.dumps(tenants), "REACTQ_TENANTS_PLAN": "standard",
           "REACTQ_SANDBOX_BACKEND": "docker", "REACTQ_SANDBOX_IMAGE": args.image,
           "REACTQ_SANDBOX_TIERS_FILE": str(tiers_file(args.runtime, workdir)),
           "REACTQ_SANDBOX_POOL_TIERS": "standard"}
    common = ["--metrics-port", "0", "--loglevel", "WARNING"]
    names = [f"steps-{kind}", f"sandbox-{kind}"]
    steps = bench.procs.start(names[0], [str(BIN / "reactq"), "worker", "--queues", "steps", "-c", "16", *common,
                                         *shlex.split(args.step_worker_args)], env)
    sandbox = bench.procs.start(names[1], [str(BIN / "reactq"), "worker", "--queues", "sandbox", "-c", "16",
                                           *common], env)
    asked = questions(kind, args.runs)
    files = []  # each tenant its own batch (a batch is one tenant's), all at once
    for t, tenant in enumerate(tenants):
        infile, outfile = workdir / f"in-{kind}-{tenant}.jsonl", workdir / f"out-{kind}-{tenant}.jsonl"
        infile.write_text("".join(json.dumps({"id": f"r{i}", "question": q, "tenant": tenant}) + "\n"
                                  for i, (q, _) in enumerate(asked) if i % len(tenants) == t))
        files.append((infile, outfile))
    latest = {name: proc.pid for name, proc in bench.procs.procs}  # this kind's redis and stub: the last started
    roots = {"step worker": steps.pid, "sandbox worker": sandbox.pid, "redis-server": latest["redis"],
             "model server (stub)": latest["stub"]}
    try:
        bench.wait_ready(names, redis_url)
        wait_pool(sandbox.pid, 2)
        cli0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        containers = container_pids(sandbox.pid)
        before, busy0 = snapshot(), machine_busy_s()
        load = os.getloadavg()[0]
        clis = [subprocess.Popen([str(BIN / "reactq"), "batch", str(infile), "--out", str(outfile)], cwd=ROOT,
                                 env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True) for infile, outfile in files]
        failed = [(cli.wait(args.timeout), cli.stderr.read() if cli.stderr else "") for cli in clis]
        after, busy1 = snapshot(), machine_busy_s()
        containers |= container_pids(sandbox.pid)
        cli1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if any(code for code, _ in failed):
            raise RuntimeError(f"a reactq batch failed: {[e[-1000:] for code, e in failed if code]}")
        spent = cpu_by_group(before, after, grouper(roots, containers, after))
        spent["batch CLI"] = cli1.ru_utime + cli1.ru_stime - cli0.ru_utime - cli0.ru_stime
        spent["other"] = (busy1 - busy0) - sum(spent.values())
        lines = [json.loads(line) for _, outfile in files for line in outfile.read_text().splitlines()]
        right = sum(1 for line in lines if line["status"] == "succeeded"
                    and asked[int(line["id"][1:])][1] in (line["answer"] or ""))
        step_count = sum(int(line["steps"]) for line in lines)
        return {"kind": kind, "runs": len(lines), "right": right, "steps": step_count, "cpu": spent, "load": load,
                "machine": busy1 - busy0}
    finally:
        bench.procs.stop(names, grace=30)
        bench.procs.stop(["stub", "redis"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--kinds", default="calculator,python")
    ap.add_argument("--runtime", default="runc")
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-worker-args", default="", help="more options for the step worker's `celery worker`, "
                    "e.g. '-P solo' (no hand-off to a pool thread)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reactq-cpu-per-run-"))
    bench = Bench(argparse.Namespace(loglevel="WARNING"), workdir)
    results = []
    try:
        for kind in args.kinds.split(","):
            results.append(measure(bench, args, kind, workdir))
    finally:
        bench.procs.stop()
    header = "| process | " + " | ".join(f"{r['kind']}: ms/run | ms/step" for r in results) + " |"
    rows = [header, "|---|" + "---|---|" * len(results)]
    for group in (*GROUPS, "machine"):
        cells = []
        for r in results:
            cpu = r["cpu"] if group != "machine" else {"machine": r["machine"]}
            value = float(cpu.get(group, 0.0))  # type: ignore[union-attr]
            cells.append(f"{value / r['runs'] * 1000:.1f} | {value / r['steps'] * 1000:.2f}")  # type: ignore[operator]
        rows.append(f"| {group} | " + " | ".join(cells) + " |")
    summary = [f"{r['kind']}: {r['right']}/{r['runs']} right, {r['steps']} steps, load average {r['load']:.1f} "
               "at the start" for r in results]
    text = "\n".join([f"command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`", *summary, "", *rows])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(r["right"] == r["runs"] for r in results) else 2


if __name__ == "__main__":
    sys.exit(main())
