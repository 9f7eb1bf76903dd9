"""Replay and fork: a new run that reuses another run's recorded steps before step N and continues from
there, possibly with another model or mode (`reactq replay`, `POST /v1/runs/{id}/replay`). Steps are
numbered from 1, as `reactq trace` shows them."""

from __future__ import annotations

from collections.abc import Callable

from ..config import Settings
from ..core.models import Mode, Run, RunSpec, Usage
from ..errors import InvalidRequest
from ..store.runs import RunStore
from ..tenancy.plans import known_tiers
from .submit import new_run, validate_spec

__all__ = ["replay"]


def replay(store: RunStore, settings: Settings, source_id: str, from_step: int, send_step: Callable[[str, int], None],
           *, model: str | None = None, mode: Mode | None = None) -> Run:
    """Create and start the fork. Raises InvalidRequest for an unknown run or a step it never recorded."""
    source = store.load_run(source_id)
    if source is None:
        raise InvalidRequest(f"no run {source_id!r}")
    steps = store.load_steps(source_id)
    if not 1 <= from_step <= len(steps) + 1:
        raise InvalidRequest(f"--from-step must be between 1 and {len(steps) + 1} (run {source_id} recorded "
                             f"{len(steps)} step(s)), got {from_step}")
    kept = steps[: from_step - 1]
    spec = RunSpec(question=source.spec.question, tenant=source.spec.tenant, tier=source.spec.tier,
                   max_steps=source.max_steps, mode=mode or source.mode, model=model or source.model)
    validate_spec(spec, settings, known_tiers(settings))
    run = new_run(spec, settings)
    run.current_step = len(kept)
    run.usage = sum((s.usage for s in kept), Usage())
    run.cost_usd = sum(s.cost_usd for s in kept)
    run.approvals = [a for a in source.approvals if a.step < len(kept)]
    run.forked_from = source.id
    if run.current_step >= run.max_steps:
        run.max_steps = run.current_step + 1  # room for at least the step being replayed
    store.copy_steps(run.id, kept)  # before the run exists: nothing reads steps of a run not yet created
    store.submissions.create_runs([run])
    send_step(run.id, run.current_step)
    return run
