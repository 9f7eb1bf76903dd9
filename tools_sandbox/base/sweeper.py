"""The sweeper: every few seconds, kill and remove any sandbox container that has lived too long.

Whoever started it. The host — not the worker that made a container — bounds its life, so a
worker that hung, died, or failed to remove a container cannot leave code running.

Rules, per labelled container (its tier from its label; a tier this worker does not know gets
`UNKNOWN_TIER_CAP_S`):
- `overran`:  executing on this worker for longer than the tier's wall time + grace.
- `orphan`:   its owner label names a process on this host that is gone.
- `expired`:  older (since creation) than the larger of the tier's max idle age and max age, plus
  its wall time and the grace. An unbound warm container waits unused for at most its max idle
  age, and a bound one starts no execution past its max age (the pool retires it then); an
  execution lasts at most the wall time, so a container of any live, healthy worker — this one
  or another sharing the engine — never reaches this age. Warm containers are therefore not
  swept for being old: age is counted from creation only past the point no execution can reach.
- `leftover`: stopped for longer than the grace (a removal that failed), or created and never
  started for longer than the tier's wall time + grace (an abandoned creation). Counted from the
  stop, not the creation: the worker that just stopped a container may still be inspecting it.
Start-up additionally reaps orphans before the pool fills (DockerBackend.reap_orphans).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .models import ReapReason, Tier

log = logging.getLogger(__name__)

UNKNOWN_TIER_CAP_S = 3600.0


@dataclass(frozen=True)
class SweepPolicy:
    """The limits the sweeper applies."""

    tiers: dict[str, Tier]
    grace_s: float
    default_max_idle_s: float
    default_max_age_s: float = 0.0

    def max_life(self, tier: Tier) -> float:
        """The longest a healthy container of `tier` waits or serves before its pool retires it."""
        idle = tier.max_idle_s if tier.max_idle_s is not None else self.default_max_idle_s
        age = tier.max_age_s if tier.max_age_s is not None else self.default_max_age_s
        return max(idle, age)

    def verdict(self, container: dict, *, now: float, executing_since: float | None,
                owner_alive: bool, stopped_at: float | None = None) -> ReapReason | None:
        """Whether (and why) one container from the engine's list must go now."""
        tier = self.tiers.get((container.get("Labels") or {}).get("reactq.sandbox.tier", ""))
        age = now - float(container.get("Created") or now)
        running = container.get("State") == "running"
        wall = tier.wall_time_s if tier is not None else UNKNOWN_TIER_CAP_S
        if not running:
            if stopped_at is not None:
                return ReapReason.LEFTOVER if now - stopped_at > self.grace_s else None
            return ReapReason.LEFTOVER if age > wall + self.grace_s else None
        if executing_since is not None and tier is not None and now - executing_since > wall + self.grace_s:
            return ReapReason.OVERRAN
        if not owner_alive:
            return ReapReason.ORPHAN
        cap = UNKNOWN_TIER_CAP_S if tier is None else self.max_life(tier) + wall + self.grace_s
        return ReapReason.EXPIRED if age > cap else None


class Sweeper:
    """A daemon thread calling `sweep_once` every `interval_s` until closed."""

    def __init__(self, sweep_once: Callable[[], list[tuple[str, ReapReason]]], interval_s: float,
                 on_reaped: Callable[[ReapReason], None]) -> None:
        self._sweep_once = sweep_once
        self.interval_s = interval_s
        self._on_reaped = on_reaped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sandbox-sweeper", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def run_once(self) -> list[tuple[str, ReapReason]]:
        reaped = self._sweep_once()
        for cid, reason in reaped:
            log.warning("sandbox sweeper removed container %s (%s)", cid[:12], reason)
            self._on_reaped(reason)
        return reaped

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - engine trouble: try again next round
                log.exception("sandbox sweep failed")
