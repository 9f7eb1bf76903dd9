"""Submitting, inspecting and cancelling runs: what the CLI and the HTTP API share."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .config import Settings
from .core.models import Run, RunSpec, RunStatus
from .errors import InvalidRequest
from .store import RunStore
from .webhooks import validate_url


def known_tiers(settings: Settings) -> list[str]:
    try:
        from tools_sandbox import load_tiers

        return sorted(load_tiers())
    except Exception:  # tools_sandbox absent or its tiers file unreadable: fall back to settings
        return list(settings.tiers)


def validate_spec(spec: RunSpec, settings: Settings, tiers: Sequence[str], where: str = "") -> None:
    prefix = f"{where}: " if where else ""
    question = spec.question.strip()
    if not question:
        raise InvalidRequest(f"{prefix}the question is empty")
    if len(spec.question) > settings.max_question_chars:
        raise InvalidRequest(
            f"{prefix}the question has {len(spec.question)} characters; the limit is "
            f"{settings.max_question_chars} (REACTQ_MAX_QUESTION_CHARS)"
        )
    if spec.tenant not in settings.tenants:
        raise InvalidRequest(
            f"{prefix}unknown tenant {spec.tenant!r}; known tenants: {', '.join(settings.tenants)} "
            "(configure REACTQ_TENANTS)"
        )
    if spec.tier not in tiers:
        raise InvalidRequest(f"{prefix}unknown tier {spec.tier!r}; known tiers: {', '.join(tiers)}")
    if spec.max_steps is not None and not 1 <= spec.max_steps <= 200:
        raise InvalidRequest(f"{prefix}max_steps must be between 1 and 200, got {spec.max_steps}")
    if spec.webhook_url is not None:
        try:
            validate_url(spec.webhook_url)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{prefix}{exc}") from None


def new_run(spec: RunSpec, settings: Settings) -> Run:
    now = time.time()
    return Run(
        spec=spec.model_copy(update={"question": spec.question.strip()}),
        max_steps=spec.max_steps or settings.max_steps,
        mode=spec.mode or settings.mode,
        model=spec.model or settings.model,
        created_at=now,
        updated_at=now,
        deadline_s=settings.run_deadline_s,
    )


def submit(
    store: RunStore, specs: Sequence[RunSpec], settings: Settings, send_step: Callable[[str, int], None],
    batch_id: str | None = None,
) -> list[Run]:
    """Validate every spec first (nothing is submitted if one is bad), then record and enqueue them."""
    tiers = known_tiers(settings)
    for spec in specs:
        validate_spec(spec, settings, tiers, where=f"run {spec.client_id}" if spec.client_id else "")
    runs = [new_run(spec.model_copy(update={"batch_id": batch_id}), settings) for spec in specs]
    store.create_runs(runs, batch_id)
    for run in runs:
        send_step(run.id, 0)
    return runs


def new_batch_id() -> str:
    return "b-" + uuid.uuid4().hex[:16]


def cancel(store: RunStore, run_id: str) -> Run | None:
    """Cancel a queued or running run; it stops at its next step. Returns the run as it is now."""

    def mutate(run: Run) -> bool:
        if run.status.finished:
            return False
        run.status = RunStatus.CANCELLED
        run.error = "cancelled by request"
        run.finished_at = time.time()
        return True

    return store.update_run(run_id, mutate) or store.load_run(run_id)


def batch_view(store: RunStore, batch_id: str) -> dict[str, Any] | None:
    """A batch as `GET /v1/batches/{id}` returns it (and its webhook sends it), or None if unknown."""
    if not store.batch_info(batch_id):
        return None
    run_ids = store.batch_run_ids(batch_id)
    finished = store.batch_finished_count(batch_id)  # read first: every run it counts is finished in what follows
    info = store.batch_info(batch_id)
    counts: dict[str, int] = {}
    for run in store.load_runs(run_ids):
        if run is not None:
            counts[run.status.value] = counts.get(run.status.value, 0) + 1
    return {
        "batch_id": batch_id,
        "size": len(run_ids),
        "finished": finished,
        "statuses": counts,
        "usage": {k: float(v) for k, v in info.items() if k in ("prompt_tokens", "completion_tokens", "cost_usd")},
        "run_ids": run_ids,
    }
