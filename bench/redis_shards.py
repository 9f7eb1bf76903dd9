"""Run state on one redis-server against a Redis Cluster of 3 and of 6 primaries; then, on 3 primaries with a
replica each, WAIT for a replica after each write against `min-replicas-to-write` on the nodes.

    python bench/redis_shards.py [--procs 4] [--in-flight 100] [--concurrency 50] [--window 20] [--rounds 3]
                                 [--only scale|replicas]

Every case gets fresh servers (a Redis that served an earlier case could answer from what it stored), a fresh
`reactq stub` (latency 0) and P `reactq worker` processes, driven by bench/throughput.py's in-flight driver
(runs "What is A * B + C?", 2 steps each, topped up as they finish; steps/s = the stub's completions in the
window). The Celery broker is always a redis-server of its own, so only run state moves:
  single:    state on one redis-server
  cluster-3: state on 3 primaries, no replicas      cluster-6: 6 primaries, no replicas
  wait:      3 primaries + 1 replica each, REACTQ_REDIS_WAIT_REPLICAS=1 (WAIT after each commit and new run)
  min-repl:  the same nodes started with min-replicas-to-write 1, min-replicas-max-lag 10, WAIT_REPLICAS=0
(wait and min-repl alternate, --rounds pairs; then, unless --no-degraded, one more pair with one replica
SIGKILLed before the workers start, so its primary has none). Every node runs without persistence, as
throughput.py's server does.
Per node, over the window: CPU us per step (/proc/PID/stat), keys (DBSIZE at the end) and commands
(INFO commandstats calls, reset at the window's start). The ceiling is the steps/s the busiest node would allow
at one full core: 1e6 / its CPU us per step. Prints tables; writes only logs, under a temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.throughput import Bench, Result  # noqa: E402
from tests.fixtures_redis_cluster import RedisClusterNodes  # noqa: E402
from tests.waiting import wait_for  # noqa: E402
from worker.store import keys  # noqa: E402

MIN_REPLICAS = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]


@dataclass
class Node:
    port: int
    role: str = "master"
    cpu_us: float = 0.0  # CPU us per step over the window
    keys: int = 0
    calls: int = 0
    by_command: dict[str, int] = field(default_factory=dict)  # INFO commandstats calls
    shared: list[str] = field(default_factory=list)  # its keys that are no run's own (active set, batch, tenant...)


@dataclass
class Case:
    name: str
    result: Result
    nodes: list[Node] = field(default_factory=list)

    @property
    def primaries(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "master"]


def shares(values: list[float]) -> list[float]:
    """Each value's share of their sum, in percent."""
    total = sum(values)
    return [100.0 * v / total if total else 0.0 for v in values]


def imbalance(values: list[float]) -> float:
    """The largest value over the mean: 1.0 is an even spread, N means one of N holds everything."""
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def ceiling(busiest_us_per_step: float) -> float:
    """Steps/s a node spending this much CPU per step would allow at one full core."""
    return 1e6 / busiest_us_per_step if busiest_us_per_step > 0 else float("inf")


def scale_table(cases: list[Case]) -> str:
    lines = ["| case | primaries | steps/s | workers CPU us/step | redis CPU us/step per primary | redis total "
             "| keys % per primary (max/mean) | calls/step, % per primary (max/mean) | ceiling steps/s (busiest) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        p = c.primaries
        cpu = [n.cpu_us for n in p]
        keys_, calls = [float(n.keys) for n in p], [float(n.calls) for n in p]
        lines.append(
            f"| {c.name} | {len(p)} | {c.result.rate:.1f} | {c.result.cpu_us.get('workers', 0):.0f} | "
            f"{' / '.join(f'{v:.0f}' for v in cpu)} | {sum(cpu):.0f} | "
            f"{' / '.join(f'{v:.0f}' for v in shares(keys_))} ({imbalance(keys_):.2f}) | "
            f"{sum(calls) / (c.result.steps or 1):.1f}: {' / '.join(f'{v:.0f}' for v in shares(calls))} "
            f"({imbalance(calls):.2f}) | "
            f"{ceiling(max(cpu, default=0.0)):.0f} |")
    return "\n".join(lines)


def replicas_table(cases: list[Case], first_round: int = 1) -> str:
    lines = ["| round | case | steps/s | workers CPU us/step | redis CPU us/step: primaries, replicas, total "
             "| commands/step on primaries | WAIT/step |",
             "|---|---|---|---|---|---|---|"]
    for i, c in enumerate(cases):
        steps = c.result.steps or 1
        prim = sum(n.cpu_us for n in c.primaries)
        repl = sum(n.cpu_us for n in c.nodes if n.role != "master")
        calls = sum(n.calls for n in c.primaries) / steps
        waits = sum(n.by_command.get("wait", 0) for n in c.primaries) / steps
        lines.append(f"| {first_round + i // 2} | {c.name} | {c.result.rate:.1f} | "
                     f"{c.result.cpu_us.get('workers', 0):.0f} | {prim:.0f}, {repl:.0f}, {prim + repl:.0f} | "
                     f"{calls:.1f} | {waits:.2f} |")
    return "\n".join(lines)


def shared_keys(client: Any, limit: int = 8) -> list[str]:
    """The node's keys outside any run's own, by family: a hash tag's content shown as {..}, a run id as <id>."""
    found: set[str] = set()
    for key in client.scan_iter(count=1000):
        name = key.decode()
        if not name.startswith("reactq:run:"):
            found.add(re.sub(r"[0-9a-f]{32}", "<id>", re.sub(r"\{[^}]*\}", "{..}", name)))
    return sorted(found)[:limit]


def hot_keys_lines(cases: list[Case]) -> list[str]:
    """For each cluster case: which shared keys the primary that ran the most commands holds."""
    lines = []
    for c in cases:
        if len(c.primaries) > 1:
            busiest = max(c.primaries, key=lambda n: n.calls)
            share = 100.0 * busiest.calls / (sum(n.calls for n in c.primaries) or 1)
            lines.append(f"{c.name}: the busiest primary ({share:.0f}% of calls) holds {', '.join(busiest.shared)}")
    return lines


def commands_table(cases: list[Case], top: int = 8) -> str:
    """Calls per step of the commands the primaries ran most, by case."""
    lines = ["| case | commands per step on the primaries (most called first) |", "|---|---|"]
    for c in cases:
        summed: dict[str, int] = {}
        for n in c.primaries:
            for name, calls in n.by_command.items():
                summed[name] = summed.get(name, 0) + calls
        steps = c.result.steps or 1
        ranked = sorted(summed.items(), key=lambda item: -item[1])[:top]
        lines.append(f"| {c.name} | {', '.join(f'{name} {calls / steps:.2f}' for name, calls in ranked)} |")
    return "\n".join(lines)


class Shards:
    """One case at a time: fresh state servers, the in-flight driver, then each node's figures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.logdir = Path(tempfile.mkdtemp(prefix="reactq-shards-"))
        self.bench = Bench(args, self.logdir)

    def run(self, name: str, primaries: int = 0, replicas: int = 0, wait_replicas: int = 0,
            options: list[str] | None = None, kill_replica: bool = False) -> Case:
        """`primaries` 0: state on one redis-server; else a cluster of that many with `replicas` each
        (`kill_replica`: one of them SIGKILLed once linked, before the workers start)."""
        keys.use_hash_tags(primaries > 0)
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self.bench.procs.stop, ["state"])
            if primaries:
                cluster = RedisClusterNodes(self.logdir / f"{name}-{self.bench.seq}", primaries, replicas,
                                            ["--appendonly", "no", *(options or [])])
                cleanup.callback(cluster.stop)
                cluster.start()
                state_url = cluster.url
                ports = list(cluster.procs)
                self.bench.watched = {f"node-{port}": proc.pid for port, proc in cluster.procs.items()}
                cleanup.callback(self.bench.watched.clear)
            else:
                state_url = self.bench.start_redis("state")
                ports = [int(state_url.rsplit(":", 1)[1].split("/")[0])]
            clients = {port: cleanup.enter_context(redis.Redis(port=port, socket_timeout=10)) for port in ports}
            if replicas:  # min-replicas-to-write refuses writes until each primary's replica is linked
                wait_for("every primary's replicas to be linked",
                         lambda: [c.info("replication") for c in clients.values()], 60, 0.1,
                         until=lambda infos: all(i.get("connected_slaves", 0) >= replicas for i in infos
                                                 if i["role"] == "master"))
            if kill_replica:
                victim = next(port for port, c in clients.items() if c.info("replication")["role"] == "slave")
                cluster.kill(victim)
                del clients[victim]
                self.bench.watched.pop(f"node-{victim}")
            nodes = [Node(port) for port in clients]
            self.bench.on_window = lambda mark: window_mark(mark, nodes, clients)
            cleanup.callback(setattr, self.bench, "on_window", None)
            a = self.args
            try:
                result = self.bench.reactq(name, 0, a.in_flight, a.concurrency, a.warmup, a.window,
                                           state_url=state_url, wait_replicas=wait_replicas)
            except Exception as exc:  # a degraded case may refuse writes: what it did is the finding
                if not kill_replica:
                    raise
                result = Result(name, "reactq", "threads", a.procs, a.concurrency, a.in_flight, 0,
                                errors=[f"the driver stopped: {type(exc).__name__}: {str(exc)[:300]}"])
        for n in nodes:
            n.cpu_us = result.cpu_us.get(f"node-{n.port}", result.cpu_us.get("state", 0.0))
        return Case(name, result, nodes)


def window_mark(mark: str, nodes: list[Node], clients: dict[int, Any]) -> None:
    """At the window's start, each node's command counts reset; at its end, each node's figures read."""
    for n in nodes:
        client = clients[n.port]
        if mark == "start":
            client.config_resetstat()
            continue
        n.role = client.info("replication")["role"]
        n.keys = int(client.dbsize())
        n.by_command = {name.removeprefix("cmdstat_"): int(stat["calls"])
                        for name, stat in client.info("commandstats").items()}
        n.calls = sum(n.by_command.values())
        n.shared = shared_keys(client)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4, help="reactq worker processes")
    ap.add_argument("--concurrency", type=int, default=50, help="threads per worker process")
    ap.add_argument("--in-flight", type=int, default=100, help="runs kept in flight")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3, help="pairs of (wait, min-repl), alternated")
    ap.add_argument("--only", choices=["scale", "replicas"], default=None)
    ap.add_argument("--no-degraded", action="store_true", help="skip the pair with a replica killed")
    ap.add_argument("--loglevel", default="WARNING", help="worker log level")
    args = ap.parse_args()

    shards = Shards(args)
    scale: list[Case] = []
    paired: list[Case] = []
    degraded: list[Case] = []
    try:
        if args.only in (None, "scale"):
            for name, primaries in (("single", 0), ("cluster-3", 3), ("cluster-6", 6)):
                scale.append(shards.run(name, primaries))
                print(scale_table(scale[-1:]), flush=True)
        if args.only in (None, "replicas"):
            for _ in range(args.rounds):  # alternated, so a burst of other load hits both alike
                paired.append(shards.run("wait", 3, 1, wait_replicas=1))
                paired.append(shards.run("min-repl", 3, 1, wait_replicas=0, options=MIN_REPLICAS))
                print(replicas_table(paired[-2:], len(paired) // 2), flush=True)
            if not args.no_degraded:
                degraded.append(shards.run("wait, replica killed", 3, 1, wait_replicas=1, kill_replica=True))
                degraded.append(shards.run("min-repl, replica killed", 3, 1, wait_replicas=0, options=MIN_REPLICAS,
                                           kill_replica=True))
                print(replicas_table(degraded), flush=True)
    finally:
        shards.bench.procs.stop()

    problems = [f"{c.name}: {e}" for c in scale + paired for e in c.result.errors]
    notes = [f"{c.name}: {c.result.notes}" for c in scale + paired + degraded]
    notes += [f"{c.name} (expected of a degraded case): {e}" for c in degraded for e in c.result.errors]
    print()
    print(f"command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`")
    print(f"machine: nproc {os.cpu_count()}, Python {platform.python_version()}, {platform.platform()}, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if scale:
        print()
        print(scale_table(scale))
    if paired:
        print()
        print(replicas_table(paired))
        for name in ("wait", "min-repl"):
            rates = [c.result.rate for c in paired if c.name == name]
            print(f"{name}: median {statistics.median(rates):.1f} steps/s over {len(rates)} rounds")
    if degraded:
        print()
        print("one replica SIGKILLed before the workers started:")
        print(replicas_table(degraded))
    print()
    print(commands_table(scale + paired + degraded))
    print()
    print("\n".join(hot_keys_lines(scale + paired)))
    print()
    print("\n".join(notes + problems + [f"logs: {shards.logdir}"]))
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
