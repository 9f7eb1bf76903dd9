"""Sandboxed python through the agent path against bare `docker run`, per runtime, in one invocation.

    python bench/sandbox_agent_path.py [--runs 200] [--tenants 10] [--runtimes runc,runsc] [--batches 2] [--out FILE]
                                       [--step-worker-args '-P solo']

Per runtime (runc, runsc = gVisor), three figures:
  agent path:  a fresh redis-server and stub (`reactq stub`) on free 127.0.0.1 ports, one step worker
               (`reactq worker --queues steps -c S`) and one sandbox worker (`reactq worker --queues sandbox
               -c K`, REACTQ_SANDBOX_BACKEND=docker, warm pool of tier standard only, tiers file with
               `runtime = "<runtime>"` under every tier, REACTQ_SANDBOX_TIERS_FILE), then one `reactq batch` per
               tenant at once (a batch is one tenant's), N lines "Run this python code: ```python
               print(6*7)```" in all over T tenants (REACTQ_TENANTS, plan
               `standard`: 4 concurrent executions and 60 per minute per tenant), tier standard. Each run:
               the stub calls `python` with the code verbatim (a sandbox execution: never tool-cached),
               then answers. runs/s = N / (last run's finished_at - first run's created_at); the
               `reactq batch` process's wall time (imports and all) is reported beside it.
               Checked: every run `succeeded`, its answer and its python observation contain 42.
               Warm pool: containers the engine started for the worker during the batch (docker events),
               against N executions; the rest were served by containers bound to a tenant and reused.
  docker run:  N x `docker run --rm --network none <image> python3 -c 'print(6*7)'` (`--runtime=runsc`
               for gVisor), 50 at a time; executions/s = N / wall; each output must be 42.
  ratio:       agent-path runs/s / docker-run executions/s.
Where the time went: each python observation's duration_ms (p50/p90: the sandbox call as the step saw
it, line waiting included); CPU seconds (user + system, /proc) over the batch of each of our processes,
of dockerd + containerd, and of the whole machine (/proc/stat): the rest is per-container shims, the
containers (gVisor's sentry and gofer) and whatever else shares the machine. The same groups are sampled
every 0.1 s, and their CPU inside the runs' window (first created .. last finished: what runs/s is taken
over) is reported apart: the CLIs import before the first run exists, and that does not slow the runs.
`--batches K`: the same workers take K rounds of the ten batches, one after another, each round with its own
lines and output files (no round adopts another's runs; each run must be created after its round's CLIs
started). Round 1 meets workers whose pool holds warm containers bound to no tenant, so each tenant's first
call waits for one to be bound or started (what the ratio is taken from); later rounds meet workers already
serving these tenants, as a worker does that has been working for them, and their best is reported beside it.
Each (step concurrency, sandbox concurrency) pair of --step-concurrency x --sandbox-concurrency is
measured with its own fresh Redis and workers; the best pair's rate makes the ratio.

Target: ratio >= 10 on each runtime (docs/decisions/warm-containers.md). Exit status 1 if missed, 2 if a
measurement went wrong (a run not succeeded, an output without 42, a docker run that failed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_cpu import machine_busy_s, process_cpu_s, snapshot  # noqa: E402
from bench.throughput import BIN, Bench  # noqa: E402

os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this tree

IMAGE = "reactq-sandbox:latest"
CODE = "print(6*7)"
CPU_GROUPS = ("steps", "sandbox", "redis", "stub", "batch CLI", "dockerd+containerd", "machine")
ENGINE = ("dockerd", "containerd")
QUESTION = f"Run this python code:\n```python\n{CODE}\n```"


@dataclass
class AgentResult:
    runtime: str
    step_conc: int
    sandbox_conc: int
    batch: int = 1  # the round on these workers: 1 = the first batches they take
    runs: int = 0
    seconds: float = 0.0  # first created_at .. last finished_at
    cli_seconds: float = 0.0  # the `reactq batch` processes, start to the last one's exit
    statuses: dict[str, int] = field(default_factory=dict)
    with_42: int = 0
    containers_started: int | None = None
    obs_ms: list[int] = field(default_factory=list)  # duration_ms of each python observation
    cpu: dict[str, float] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)  # first run created, last run finished (wall clock)
    window_cpu: dict[str, float] = field(default_factory=dict)  # CPU s of each group inside `window`
    lead_s: float = 0.0  # from starting the CLIs to the first run's creation (their imports, mostly)
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.step_conc} x {self.sandbox_conc}" + (f", batch {self.batch}" if self.batch > 1 else "")

    @property
    def rate(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0


def tiers_file(runtime: str, workdir: Path) -> Path:
    """tools_sandbox/tiers.toml with `runtime = "<runtime>"` under every [tiers.X] table (runc: unchanged)."""
    from tools_sandbox.base.tiers import requiring_runtime

    path = workdir / f"tiers-{runtime}.toml"
    path.write_text(requiring_runtime((ROOT / "tools_sandbox" / "tiers.toml").read_text(), runtime))
    return path


def engine_pids() -> list[int]:
    """The engine's long-lived daemons (per-container shims are not counted)."""
    return [p.pid for p in snapshot().values() if p.name in ENGINE]


def engine_cpu_s(pids: list[int] | None = None) -> float:
    """CPU seconds so far of the engine's daemons (`pids`, found once by a caller that reads them often)."""
    return sum(process_cpu_s(pid) for pid in (engine_pids() if pids is None else pids))


def docker_starts(since: float, until: float, owner_pid: int) -> int | None:
    """Containers started for the sandbox worker (pid `owner_pid`) in [since, until], from docker events."""
    argv = ["docker", "events", "--since", f"{since:.3f}", "--until", f"{until + 1:.3f}", "--format",
            "{{json .}}", "--filter", "type=container", "--filter", "event=start",
            "--filter", "label=reactq.sandbox=1"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    count = 0
    for line in out.splitlines():
        attrs = json.loads(line).get("Actor", {}).get("Attributes", {})
        if f"/{owner_pid}/" in attrs.get("reactq.sandbox.owner", ""):
            count += 1
    return count


class CpuTimeline:
    """Samples each group's CPU seconds (and the machine's) every `every` s in a thread, so that the CPU spent
    inside the runs' window (first created .. last finished, known only afterwards) can be read back: the
    CLIs' imports come before it, and what they spend there does not slow the runs down."""

    def __init__(self, read: Callable[[], dict[str, float]], every: float = 0.1) -> None:
        self.read, self.every = read, every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuTimeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), self.read()))
            if self._stop.wait(self.every):
                self.samples.append((time.time(), self.read()))
                return

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds of each group from the last sample at or before `start` to the first at or after `end`."""
        before = [cpu for t, cpu in self.samples if t <= start] or [self.samples[0][1]]
        after = [cpu for t, cpu in self.samples if t >= end] or [self.samples[-1][1]]
        return {g: after[0][g] - before[-1].get(g, 0.0) for g in after[0]}


def wait_pool(owner_pid: int, want: int, timeout: float = 60.0) -> set[str]:
    """Until the sandbox worker has `want` warm containers running (not timed): their OCI runtimes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["docker", "ps", "--filter", "label=reactq.sandbox=1", "--format",
                              '{{.ID}} {{.Label "reactq.sandbox.owner"}}'], capture_output=True, text=True).stdout
        ids = [line.split()[0] for line in out.splitlines() if f"/{owner_pid}/" in line]
        if len(ids) >= want:
            return set(subprocess.run(["docker", "inspect", "--format", "{{.HostConfig.Runtime}}", *ids],
                                      capture_output=True, text=True).stdout.split())
        time.sleep(0.2)
    raise RuntimeError(f"the warm pool did not reach {want} containers in {timeout:.0f}s")


def agent_path(bench: Bench, args: argparse.Namespace, runtime: str, step_conc: int, sandbox_conc: int,
               workdir: Path) -> list[AgentResult]:
    """One configuration's fresh Redis, stub and workers, taking `args.batches` rounds of ten batches one after
    another: one result per round."""
    redis_url = bench.start_redis()
    stub_url = bench.start_stub(0)
    tenants = [f"t{i:02d}" for i in range(args.tenants)]
    env = {"REACTQ_REDIS_URL": redis_url, "REACTQ_LLM_BASE_URL": f"{stub_url}/v1",
           "REACTQ_TENANTS": json.dumps(tenants), "REACTQ_TENANTS_PLAN": "standard",
           "REACTQ_SANDBOX_BACKEND": "docker", "REACTQ_SANDBOX_IMAGE": args.image,
           "REACTQ_SANDBOX_TIERS_FILE": str(tiers_file(runtime, workdir)), "REACTQ_SANDBOX_POOL_TIERS": "standard"}
    names = [f"steps-{runtime}-{step_conc}", f"sandbox-{runtime}-{sandbox_conc}"]
    common = ["--metrics-port", "0", "--loglevel", args.loglevel]
    bench.procs.start(names[0], [str(BIN / "reactq"), "worker", "--queues", "steps", "-c", str(step_conc), *common,
                                 *shlex.split(args.step_worker_args)], env)
    sandbox = bench.procs.start(names[1], [str(BIN / "reactq"), "worker", "--queues", "sandbox",
                                           "-c", str(sandbox_conc), *common], env)
    results: list[AgentResult] = []
    try:
        bench.wait_ready(names, redis_url)
        runtimes = wait_pool(sandbox.pid, 2)
        for batch in range(1, args.batches + 1):
            results.append(res := AgentResult(runtime, step_conc, sandbox_conc, batch))
            files = batch_files(args, tenants, workdir, f"{runtime}-{step_conc}-{sandbox_conc}-{batch}")
            one_round(bench, args, env, files, sandbox.pid, res)
        if runtimes != {runtime}:  # the configuration's, reported once
            results[0].errors.append(f"the warm containers run on {runtimes}, not {runtime}")
        results[-1].errors += bench.scan_errors(names, stub_url)
    finally:
        bench.procs.stop(names, grace=30)  # warm shutdown: the sandbox worker destroys its pool
        bench.procs.stop(["stub", "redis"])
    return results


def batch_files(args: argparse.Namespace, tenants: list[str], workdir: Path, tag: str) -> dict[str, tuple[Path, Path]]:
    """tenant -> (its batch file, its output) for one round: a batch is one tenant's, so each submits its own.
    Line ids and files are the round's own, so no round adopts an earlier round's runs."""
    files = {}
    for t, tenant in enumerate(tenants):
        infile = workdir / f"in-{tag}-{tenant}.jsonl"
        infile.write_text("".join(json.dumps({"id": f"{tag}-r{i}", "question": QUESTION, "tier": "standard"}) + "\n"
                                  for i in range(t, args.runs, len(tenants))))
        outfile = workdir / f"out-{tag}-{tenant}.jsonl"
        outfile.unlink(missing_ok=True)  # an earlier invocation's: the CLI would take its lines as done
        files[tenant] = (infile, outfile)
    return files


def one_round(bench: Bench, args: argparse.Namespace, env: dict[str, str], files: dict[str, tuple[Path, Path]],
              sandbox_pid: int, res: AgentResult) -> None:
    """Ten `reactq batch` at once, one per tenant, measured into `res`; every run checked."""
    redis_url = env["REACTQ_REDIS_URL"]
    cli0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, busy0, engine0 = bench.cpu_seconds(), machine_busy_s(), engine_cpu_s()
    t0, wall0 = time.monotonic(), time.time()
    clis: dict[str, subprocess.Popen[str]] = {}
    with CpuTimeline(timeline_reader(bench, clis)) as timeline:
        clis.update({tenant: subprocess.Popen([str(BIN / "reactq"), "batch", str(infile), "--out", str(outfile),
                                               "--tenant", tenant], cwd=ROOT, env={**os.environ, **env},
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for tenant, (infile, outfile) in files.items()})
        failed = {tenant: cli.communicate(timeout=args.timeout)[1] for tenant, cli in clis.items()}
    res.cli_seconds, wall1 = time.monotonic() - t0, time.time()
    cpu1, busy1, engine1 = bench.cpu_seconds(), machine_busy_s(), engine_cpu_s()
    res.cpu = {cpu_group(g): cpu1[g] - cpu0.get(g, 0.0) for g in cpu1}
    cli1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res.cpu["dockerd+containerd"] = engine1 - engine0
    res.cpu["batch CLI"] = cli1.ru_utime + cli1.ru_stime - cli0.ru_utime - cli0.ru_stime
    res.cpu["machine"] = busy1 - busy0
    for tenant, cli in clis.items():
        if cli.returncode != 0:
            res.errors.append(f"reactq batch of {tenant} exited {cli.returncode}: {failed[tenant][-1500:]}")
    res.containers_started = docker_starts(wall0, wall1, sandbox_pid)
    res.statuses, res.with_42 = check_runs(redis_url, [out for _, out in files.values()], res)
    if res.runs and res.window[0] < wall0:
        res.errors.append("a run of this round was created before its CLIs started")
    res.window_cpu = timeline.between(*res.window)
    res.lead_s = res.window[0] - wall0
    if res.statuses.get("succeeded", 0) != args.runs:
        res.errors.append(f"runs: {res.statuses} of {args.runs}, not all succeeded")
    if res.with_42 != args.runs:
        res.errors.append(f"only {res.with_42} of {args.runs} runs had 42 in both answer and observation")


def check_runs(redis_url: str, outfiles: list[Path], res: AgentResult) -> tuple[dict[str, int], int]:
    """Statuses of the batch's runs and how many have 42 in the answer and in the python observation;
    sets res.runs and res.seconds (first run created .. last run finished)."""
    from worker.store.connection import connect
    from worker.store.runs import RunStore

    ids = [json.loads(line)["run_id"] for outfile in outfiles if outfile.exists()
           for line in outfile.read_text().splitlines() if line.strip()]
    store = RunStore(connect(redis_url, 4), 3600)
    runs = [r for r in store.load_runs(ids) if r is not None]
    statuses: dict[str, int] = {}
    good = 0
    for run in runs:
        statuses[run.status.value] = statuses.get(run.status.value, 0) + 1
        observed = [o for s in store.load_steps(run.id) for o in s.observations if o.tool == "python"]
        res.obs_ms += [o.duration_ms for o in observed]
        good += "42" in (run.answer or "") and any("42" in o.content for o in observed)
    finished = [r.finished_at for r in runs if r.finished_at]
    res.runs = len(runs)
    if runs and finished:
        res.window = (min(r.created_at for r in runs), max(finished))
        res.seconds = res.window[1] - res.window[0]
    return statuses, good


def timeline_reader(bench: Bench, clis: dict[str, subprocess.Popen[str]]) -> Callable[[], dict[str, float]]:
    """Reads, for CpuTimeline, the CPU s so far of each group of CPU_GROUPS. A CLI counts with the last figure
    seen of it once it has exited."""
    engine = engine_pids()
    last_seen: dict[int, float] = {}

    def read() -> dict[str, float]:
        cpu = {cpu_group(g): v for g, v in bench.cpu_seconds().items()}
        for cli in list(clis.values()):
            last_seen[cli.pid] = process_cpu_s(cli.pid) or last_seen.get(cli.pid, 0.0)
        cpu["batch CLI"] = sum(last_seen.values())
        cpu["dockerd+containerd"] = engine_cpu_s(engine)
        cpu["machine"] = machine_busy_s()
        return cpu
    return read


def cpu_group(name: str) -> str:
    """The CPU_GROUPS name of one of Bench.cpu_seconds' groups (the workers' names carry their sizes)."""
    return "steps" if name.startswith("steps") else "sandbox" if name.startswith("sandbox") else name


def docker_runs(args: argparse.Namespace, runtime: str) -> tuple[float, list[str], int]:
    """N `docker run --rm`, `args.parallel` at a time: (executions/s, errors, how many printed 42)."""
    argv = ["docker", "run", "--rm", "--network", "none", *([f"--runtime={runtime}"] if runtime != "runc" else []),
            args.image, "python3", "-c", CODE]

    def one(_: int) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[:200]}"

    t0 = time.monotonic()
    pool = ThreadPoolExecutor(args.parallel)
    try:
        outputs = list(pool.map(one, range(args.runs)))
    except subprocess.TimeoutExpired:
        # Every other run would wait its own 120 s: the engine has most likely deadlocked (BENCHMARKS.md,
        # "The engine's deadlock"); restart it with scripts/start-dockerd.sh after killing dockerd and containerd.
        return 0.0, ["a `docker run` did not finish in 120 s: the Docker engine stopped answering"], 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    seconds = time.monotonic() - t0
    bad = [o for o in outputs if o != "42"]
    errors = [f"{len(bad)} docker runs did not print 42, e.g. {bad[0]!r}"] if bad else []
    return args.runs / seconds, errors, len(outputs) - len(bad)


def report_agent(r: AgentResult, args: argparse.Namespace, keep: Callable[[str], None], windows: list[str]) -> None:
    """One agent-path round's table row, and its line on the CPU inside the runs' window."""
    cpu = ", ".join(f"{r.cpu.get(g, 0):.1f}" for g in CPU_GROUPS)
    started = "?" if r.containers_started is None else f"{r.containers_started} for {r.runs}"
    ms = sorted(r.obs_ms) or [0]
    keep(f"| {r.runtime} | agent path, {r.label} | {r.rate:.1f} | {r.cli_seconds:.1f} | "
         f"{ms[len(ms) // 2]}/{ms[len(ms) * 9 // 10]} | {r.statuses.get('succeeded', 0)}/{args.runs} | "
         f"{r.with_42}/{args.runs} | {started} | {cpu} | | |")
    inside = ", ".join(f"{r.window_cpu.get(g, 0):.1f}" for g in CPU_GROUPS)
    per_run = 1000 * r.window_cpu.get("machine", 0) / max(r.runs, 1)
    windows.append(f"- {r.runtime} {r.label}: the runs' window {r.seconds:.2f} s, from {r.lead_s:.2f} s after the "
                   f"CLIs started; CPU s in it ({', '.join(CPU_GROUPS)}): {inside}; {per_run:.0f} ms of the machine "
                   f"a run (window in unix time: {r.window[0]:.2f} .. {r.window[1]:.2f})")


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="N: agent-path runs, and docker runs, per runtime")
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--runtimes", default="runc,runsc")
    ap.add_argument("--step-concurrency", default="16", help="threads of the step worker (comma list: each)")
    ap.add_argument("--sandbox-concurrency", default="16", help="threads of the sandbox worker (comma list: each)")
    ap.add_argument("--batches", type=int, default=2, help="rounds of ten batches the same workers take one after "
                    "another; the first decides the ratio, the best of the later ones is reported beside it")
    ap.add_argument("--parallel", type=int, default=50, help="docker runs at a time")
    ap.add_argument("--repeat", type=int, default=1, help="measure both sides this many times, alternated, and "
                    "compare the best of each (on a shared machine, other load can only lower a figure)")
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for one `reactq batch`")
    ap.add_argument("--loglevel", default="WARNING")
    ap.add_argument("--step-worker-args", default="", help="more options for the step worker's `celery worker`, "
                    "e.g. '-P solo' (no hand-off to a pool thread)")
    ap.add_argument("--out", default=None, help="write the markdown report here too")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="reactq-agent-path-"))
    bench = Bench(args, workdir)
    rows: list[str] = []
    windows: list[str] = []  # CPU inside each agent path's window
    problems: list[str] = []
    verdicts: list[tuple[str, float, bool]] = []
    header = ("| runtime | what (agent: step x sandbox threads) | agent runs/s | batch CLI wall s | python obs ms "
              "p50/p90 | succeeded | answer+obs 42 | containers started | CPU s: " + ", ".join(CPU_GROUPS)
              + " | docker run/s | ratio |")
    print(header + "\n|" + "---|" * 11, flush=True)

    def keep(row: str) -> None:
        rows.append(row)
        print(row, flush=True)

    try:
        for runtime in args.runtimes.split(","):
            results: list[AgentResult] = []  # each configuration's first round
            later: list[AgentResult] = []  # rounds 2.. of --batches
            docker_rates: list[float] = []
            for _ in range(args.repeat):  # alternated, so a burst of other load hits both sides alike
                for sc in ints(args.step_concurrency):
                    for kc in ints(args.sandbox_concurrency):
                        for r in agent_path(bench, args, runtime, sc, kc, workdir):
                            (results if r.batch == 1 else later).append(r)
                            problems += [f"{runtime} agent path ({r.label}): {e}" for e in r.errors]
                            report_agent(r, args, keep, windows)
                rate, errors, ok = docker_runs(args, runtime)
                docker_rates.append(rate)
                problems += [f"{runtime} docker run: {e}" for e in errors]
                keep(f"| {runtime} | docker run, {args.parallel} at a time | | | | {ok}/{args.runs} | {ok}/{args.runs} "
                     f"| {args.runs} | | {rate:.1f} | |")
            best, docker_rate = max(results, key=lambda r: r.rate), max(docker_rates)
            ratio = best.rate / docker_rate if docker_rate else 0.0
            verdicts.append((runtime, ratio, ratio >= 10))
            keep(f"| **{runtime}** | best of each: agent {best.label} | **{best.rate:.1f}** "
                 f"| | | | | | | **{docker_rate:.1f}** | **{ratio:.1f}x** |")
            if later:
                warm = max(later, key=lambda r: r.rate)
                keep(f"| {runtime} | workers already serving these tenants: best agent {warm.label} | {warm.rate:.1f} "
                     f"| | | | | | | {docker_rate:.1f} | {warm.rate / docker_rate if docker_rate else 0.0:.1f}x |")
    finally:
        bench.procs.stop()

    docker_version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                                     text=True).stdout.strip()
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    machine = (f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"Docker {docker_version}")
    report = [f"command: `{command}`", f"machine: {machine}",
              f"{args.runs} runs over {args.tenants} tenants (plan standard, tier standard); docker run "
              f"{args.parallel} at a time", "", header, "|" + "---|" * 11, *rows, "", *windows, ""]
    for runtime, ratio, ok in verdicts:
        report.append(f"{runtime}: agent path / docker run = {ratio:.1f}x (target >= 10x): {'met' if ok else 'MISSED'}")
    report += problems + [f"logs: {workdir}"]
    text = "\n".join(report)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if problems:
        return 2
    return 0 if all(ok for *_, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
