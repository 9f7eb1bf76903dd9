"""The operations page's figures (pure): what Redis holds (queues, workers, limiter cells) and what the
live worker processes published (worker/runtime/ops_snapshot.py) turned into tables.

A rate is summed over the live processes, each over its own last publish interval ((now - previous) /
the interval's length); a total is the sum of the live processes' counters since each started, so a
restarted worker's past is not in it (Prometheus keeps that; this page is what Redis holds now)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LimiterCells", "OpsRaw", "OpsView", "ops_view"]


@dataclass(frozen=True)
class LimiterCells:
    model: str
    rpm_tat_us: float | None
    tpm_tat_us: float | None
    cooldown_ms: int  # left of a provider 429's cool-down (0: none)
    circuit_open_ms: int = 0  # left of its open circuit (0: closed; worker/llm/circuit.py)


@dataclass(frozen=True)
class OpsRaw:
    now: float  # this host's clock
    redis_now_us: float  # Redis's clock (the limiter cells are on it)
    queues: dict[str, list[int]]  # queue -> depth of each priority list (0 first)
    unacked: int
    workers: dict[str, int]  # queue -> live workers
    active_runs: int
    limiters: list[LimiterCells]
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    reaped: list[dict[str, Any]] = field(default_factory=list)  # the reaper's latest actions, newest first


@dataclass(frozen=True)
class QueueRow:
    name: str
    total: int
    by_priority: list[int]
    workers: int


@dataclass(frozen=True)
class Figure:
    """One labelled counter: its total over the live processes and its rate per second now."""

    labels: tuple[str, ...]
    total: float
    per_s: float


@dataclass(frozen=True)
class LimiterRow:
    model: str
    rpm: int | None
    tpm: int | None
    rpm_booked_ms: float  # how far ahead of now the rpm cell has booked calls (0: idle)
    tpm_booked_ms: float
    cooldown_ms: int
    provider_429: float  # since the live processes started
    provider_429_per_min: float
    held_back: dict[str, float]  # reason (pacing, rpm, tpm, cooldown, circuit_open) -> calls, since start
    circuit_open_ms: int = 0  # left of the model's open provider circuit (0: closed)


@dataclass(frozen=True)
class SandboxRow:
    tier: str
    warm_unbound: int
    warm_bound: int
    waiting: int
    executions_per_s: float
    failures_per_s: float  # any outcome but ok
    executions: float
    quota_rejections: float


@dataclass(frozen=True)
class Process:
    member: str
    queues: list[str]
    age_s: float


@dataclass(frozen=True)
class Reaped:
    at: float
    run_id: str
    step: int
    action: str


@dataclass(frozen=True)
class OpsView:
    queues: list[QueueRow]
    unacked: int
    active_runs: int
    processes: list[Process]
    window_s: float  # the mean interval the rates are over (0: no process published yet)
    steps_per_s: float
    tokens_per_s: float
    tokens_by_model: list[Figure]  # labels (model,)
    tool_failures: list[Figure]  # labels (tool, kind), most first
    sandbox: list[SandboxRow]
    backends_up: int
    backends: int
    limiters: list[LimiterRow]
    reaper: list[Figure]  # labels (action,)
    reaped: list[Reaped]  # its latest actions on runs, newest first
    runs_ended: list[Figure]  # labels (status,)


def _split(key: str) -> tuple[str, tuple[str, ...]]:
    family, _, labels = key.partition("|")
    return family, tuple(part.partition("=")[2] for part in labels.split(",")) if labels else ()


class _Counters:
    """Totals and rates per (family, labels), summed over the snapshots."""

    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.total: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self.rate: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        for s in snapshots:
            dt = float(s["at"]) - float(s["prev_at"])
            prev = s.get("prev") or {}
            for key, value in (s.get("counters") or {}).items():
                name = _split(key)
                self.total[name] += value
                if dt > 0:
                    self.rate[name] += max(0.0, value - prev.get(key, 0.0)) / dt

    def figures(self, family: str, keep: int | None = None) -> list[Figure]:
        """The family's figures summed onto its first `keep` labels (all: None), most first."""
        total: dict[tuple[str, ...], float] = defaultdict(float)
        rate: dict[tuple[str, ...], float] = defaultdict(float)
        for (name, labels), value in self.total.items():
            if name == family:
                total[labels[:keep]] += value
                rate[labels[:keep]] += self.rate[(name, labels)]
        return sorted((Figure(labels, total[labels], rate[labels]) for labels in total),
                      key=lambda f: (-f.total, f.labels))

    def sum(self, family: str, where: dict[int, str] | None = None, rate: bool = False) -> float:
        source = self.rate if rate else self.total
        return sum(v for (name, labels), v in source.items()
                   if name == family and all(labels[i] == want for i, want in (where or {}).items()))


def ops_view(raw: OpsRaw, limits: dict[str, tuple[int | None, int | None]]) -> OpsView:
    """`limits`: model -> (rpm, tpm) of the models in REACTQ_MODELS that have a provider limit. A model is
    listed if it has one, was held back, or its provider circuit is open."""
    snaps = raw.snapshots
    counters = _Counters(snaps)
    gauges: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
    for s in snaps:
        for key, value in (s.get("gauges") or {}).items():
            gauges[_split(key)].append(value)
    intervals = [float(s["at"]) - float(s["prev_at"]) for s in snaps]

    tiers = sorted({labels[0] for (name, labels) in gauges if name.startswith("reactq_sandbox_") and labels
                    and name != "reactq_sandbox_backend_up"}
                   | {f.labels[0] for f in counters.figures("reactq_sandbox_executions_total", 1)})
    sandbox = []
    for tier in tiers:
        executions = counters.sum("reactq_sandbox_executions_total", {0: tier})
        sandbox.append(SandboxRow(
            tier,
            int(sum(gauges.get(("reactq_sandbox_warm_containers", (tier, "unbound")), []))),
            int(sum(gauges.get(("reactq_sandbox_warm_containers", (tier, "bound")), []))),
            # every sandbox worker reports the same cluster-wide line: the largest is the figure
            int(max(gauges.get(("reactq_sandbox_calls_waiting", (tier,)), [0]))),
            counters.sum("reactq_sandbox_executions_total", {0: tier}, rate=True),
            counters.sum("reactq_sandbox_executions_total", {0: tier}, rate=True)
            - counters.sum("reactq_sandbox_executions_total", {0: tier, 1: "ok"}, rate=True),
            executions, counters.sum("reactq_quota_rejections_total", {0: tier})))
    backends = [v for (name, _), values in gauges.items() if name == "reactq_sandbox_backend_up" for v in values]

    cells = {c.model: c for c in raw.limiters}
    models = sorted(set(limits) | {f.labels[0] for f in counters.figures("reactq_llm_throttled_total", 1)}
                    | {c.model for c in raw.limiters if c.circuit_open_ms > 0})
    limiter_rows = []
    for model in models:
        cell = cells.get(model)
        rpm, tpm = limits.get(model, (None, None))

        def booked(tat: float | None) -> float:
            return max(0.0, (tat - raw.redis_now_us) / 1000) if tat is not None else 0.0

        held = {f.labels[1]: f.total for f in counters.figures("reactq_llm_throttled_total")
                if f.labels[0] == model and f.labels[1] != "provider_429"}
        limiter_rows.append(LimiterRow(
            model, rpm, tpm, booked(cell.rpm_tat_us) if cell else 0.0, booked(cell.tpm_tat_us) if cell else 0.0,
            cell.cooldown_ms if cell else 0,
            counters.sum("reactq_llm_throttled_total", {0: model, 1: "provider_429"}),
            60 * counters.sum("reactq_llm_throttled_total", {0: model, 1: "provider_429"}, rate=True), held,
            cell.circuit_open_ms if cell else 0))

    return OpsView(
        queues=[QueueRow(name, sum(depths), depths, raw.workers.get(name, 0)) for name, depths in raw.queues.items()],
        unacked=raw.unacked,
        active_runs=raw.active_runs,
        processes=sorted((Process(str(s["member"]), list(s.get("queues") or []), max(0.0, raw.now - float(s["at"])))
                          for s in snaps), key=lambda p: p.member),
        window_s=sum(intervals) / len(intervals) if intervals else 0.0,
        steps_per_s=counters.sum("reactq_steps_total", rate=True),
        tokens_per_s=counters.sum("reactq_llm_tokens_total", rate=True),
        tokens_by_model=counters.figures("reactq_llm_tokens_total", 1),
        tool_failures=counters.figures("reactq_tool_failures_total"),
        sandbox=sandbox,
        backends_up=sum(1 for v in backends if v >= 1),
        backends=len(backends),
        limiters=limiter_rows,
        reaper=counters.figures("reactq_reaper_actions_total"),
        reaped=[Reaped(float(r["at"]), str(r["run_id"]), int(r["step"]), str(r["action"])) for r in raw.reaped],
        runs_ended=counters.figures("reactq_runs_total"),
    )
