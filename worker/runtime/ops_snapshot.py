"""A worker process's own metrics, published to Redis with each heartbeat for the UI's operations page
(the API processes that serve it run no steps, and a team without Grafana has no Prometheus to ask).

Each publish holds the counters now and as they were at the previous publish (at process start: all
zero), with both times, so a reader sums rates over the live processes without keeping state of its own.
Only the families the page shows, with the labels it divides by (tokens summed over tenants): a few
hundred bytes to a few kB per process, written once per `REACTQ_REAPER_INTERVAL_S`."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.registry import CollectorRegistry

from ..store.ops import OpsStore

__all__ = ["COUNTERS", "GAUGES", "Publisher", "read_families"]

# family -> the labels kept (in this order); the others are summed away
COUNTERS = {
    "reactq_steps_total": ("outcome",),
    "reactq_llm_tokens_total": ("model", "type"),
    "reactq_llm_requests_total": ("model", "outcome"),
    "reactq_llm_throttled_total": ("model", "reason"),
    "reactq_tool_failures_total": ("tool", "error_type"),
    "reactq_reaper_actions_total": ("action",),
    "reactq_runs_total": ("status",),
    "reactq_sandbox_executions_total": ("tier", "outcome"),
    "reactq_quota_rejections_total": ("tier", "quota"),
}
GAUGES = {
    "reactq_sandbox_warm_containers": ("tier", "state"),
    "reactq_sandbox_calls_waiting": ("tier",),
    "reactq_sandbox_backend_up": ("backend",),
    "reactq_tool_stuck_threads": (),
}


def read_families(registry: CollectorRegistry = REGISTRY) -> tuple[dict[str, float], dict[str, float]]:
    """(counters, gauges) of the wanted families, keyed `family|label=value,...` (non-zero counters only)."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        wanted, target = (COUNTERS.get(name), counters) if family.type == "counter" else (GAUGES.get(name), gauges)
        if wanted is None:
            continue
        for sample in family.samples:
            if sample.name != name:  # _created, and a histogram's parts
                continue
            key = name + "|" + ",".join(f"{label}={sample.labels.get(label, '')}" for label in wanted)
            target[key] = target.get(key, 0.0) + sample.value
    return {k: v for k, v in counters.items() if v}, gauges


class Publisher:
    """Publishes this process's snapshot; keeps the previous one for the rates."""

    def __init__(self, store: OpsStore, member: str, ttl_s: float, registry: CollectorRegistry = REGISTRY) -> None:
        self.store = store
        self.member = member
        self.ttl_s = ttl_s
        self.registry = registry
        self.prev_at = time.time()
        self.prev: dict[str, float] = {}

    def publish(self, queues: list[str]) -> None:
        counters, gauges = read_families(self.registry)
        now = time.time()
        snapshot: dict[str, Any] = {"member": self.member, "queues": queues, "at": now, "counters": counters,
                                    "gauges": gauges, "prev_at": self.prev_at, "prev": self.prev}
        self.store.publish(self.member, snapshot, self.ttl_s)
        self.prev_at, self.prev = now, counters
