"""Who goes first in `reactq.steps`: interactive runs ahead of batch work, and no tenant's backlog
ahead of another tenant's first runs.

The broker's Redis transport keeps one list per priority of a queue (`priority_steps` 0..9, 0 served
first; kombu's BRPOP takes the lists in that order) and a worker takes one message per thread at a time
(prefetch 1), so a message's priority decides how soon a free thread takes it. A run's priority is set
when it is submitted and every later step of the run keeps it:

- `INTERACTIVE` (0): `reactq ask`, a single `POST /v1/runs`;
- batch runs: `BATCH_FIRST` (2) for a tenant's first runs, one level lower each time the tenant's
  recent submissions double (`2 + log2(1 + recent / 8)`, capped at 9). "Recent" is the tenant's runs
  submitted in the last `WINDOW_S` (Redis counters in one-minute buckets), so a tenant that just queued
  2,000 runs gets most of them at 8-9 while another tenant's next run still gets 2.
- continuations without a priority (the reaper's re-kicks) land in the base list, which is served
  first: recovering a stranded run is never starved. A sandbox result's continuation keeps its run's
  priority: it runs the run's next model call (worker/tasks/steps.py).

docs/decisions/fair-queues.md says why this and not per-tenant queues.
"""

from __future__ import annotations

import math

INTERACTIVE = 0
BATCH_FIRST = 2
LOWEST = 9
WINDOW_S = 600
def batch_priority(recent: int) -> int:
    """The priority of a tenant's run when it has submitted `recent` runs in the window before it."""
    return min(LOWEST, BATCH_FIRST + int(math.log2(1 + recent / 8)))


def batch_priorities(recent: int, count: int) -> list[int]:
    """Priorities for `count` batch runs of a tenant that submitted `recent` runs in the window before."""
    return [batch_priority(recent + i) for i in range(count)]
