"""`reactq replay RUN_ID --from-step N [--model M] [--mode M] [--tier T]` and the printing of
`reactq trace --diff A B`."""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table
from rich.text import Text

from ..core.models import Mode
from .base import _load, _runtime, _send_step, error, out
from .display import literal


@click.command()
@click.argument("run_id")
@click.option("--from-step", "from_step", type=int, required=True,
              help="the first step to run again (as `reactq trace` numbers them, from 1)")
@click.option("--model", default=None, help="continue with this model")
@click.option("--mode", type=click.Choice([m.value for m in Mode]), default=None, help="continue in this mode")
@click.option("--tier", default=None, help="default: the source run's, if its tenant's plan still allows it")
@click.option("--json", "as_json", is_flag=True)
def replay(run_id: str, from_step: int, model: str | None, mode: str | None, tier: str | None,
           as_json: bool) -> None:
    """Fork a run: a new run reusing its steps before --from-step, continuing from there. It is admitted as a
    new run of its tenant is (the plan as it is now, budgets, runs in flight, submissions per minute)."""
    from ..core.views import run_json
    from ..errors import AdmissionRefused, InvalidRequest, TooLarge
    from ..service.replay import replay as fork

    rt = _runtime()
    _load(run_id)
    try:
        run = fork(rt.store, rt.settings, run_id, from_step, _send_step(), tenants=rt.tenants, budgets=rt.budgets,
                   model=model, mode=Mode(mode) if mode else None, tier=tier)
    except (InvalidRequest, AdmissionRefused, TooLarge) as exc:
        error(exc)
        sys.exit(2)
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    else:
        out.print(run.id)


def print_diff(run_a: str, run_b: str, *, as_json: bool) -> None:
    from ..core.trace_diff import diff_traces

    store = _runtime().store
    a, b = _load(run_a), _load(run_b)
    diff = diff_traces(a, store.load_steps(run_a), b, store.load_steps(run_b))
    if as_json:
        out.print_json(json.dumps(diff.to_json()))
        return
    table = Table(title=f"{run_a} vs {run_b}")
    for column in ("step", "", run_a[:12], run_b[:12]):
        table.add_column(column, overflow="fold")
    for pair in diff.steps:
        table.add_row(str(pair.number), "=" if pair.same else Text("≠", "red"), literal(pair.a), literal(pair.b))
    out.print(table)
    out.print(literal(f"status: {diff.statuses[0]} vs {diff.statuses[1]} · "
                      f"answer: {diff.answers[0]!r} vs {diff.answers[1]!r}"))
    out.print("the traces are the same" if diff.diverges_at is None
              else Text(f"diverge at step {diff.diverges_at}", "bold"))

