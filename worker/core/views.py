"""A run as machines see it (pure): the JSON of `reactq status --json`, `GET /v1/runs/{id}` and a run's
webhook."""

from __future__ import annotations

from typing import Any

from .models import Run, Step
from .tenant_ids import tenant_name


def run_json(run: Run, steps: list[Step] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        **run.result_line(),
        "question": run.spec.question,
        "tenant": tenant_name(run.spec.tenant),
        "tier": run.spec.tier,
        "mode": run.mode.value,
        "model": run.model,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "waiting_on": run.waiting_on,
        "max_steps": run.max_steps,
        "approvals": [a.model_dump(mode="json") for a in run.approvals],
        "forked_from": run.forked_from,
    }
    if steps is not None:
        data["trace"] = [s.model_dump() for s in steps]
    return data
