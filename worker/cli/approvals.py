"""`reactq approve RUN_ID [CALL_ID]`, `reactq reject RUN_ID [CALL_ID] --reason R`."""

from __future__ import annotations

import getpass
import json
import sys

import click

from ..errors import ApprovalConflict
from .base import _load, _runtime, _send_step, error, out
from .display import literal


def _decide(run_id: str, call_id: str | None, approve: bool, reason: str | None, as_json: bool) -> None:
    from ..core.views import run_json
    from ..runtime.approvals import record_decision

    _load(run_id)
    try:
        run = record_decision(_runtime().store, run_id, call_id, approve, f"cli:{getpass.getuser()}", reason,
                              _send_step())
    except ApprovalConflict as exc:
        error(exc)
        sys.exit(2)
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    else:
        verb = "approved" if approve else "rejected"
        out.print(literal(f"{run_id}: {verb} {call_id or 'every pending call'}; run is {run.status.value}"))


@click.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@click.option("--json", "as_json", is_flag=True)
def approve(run_id: str, call_id: str | None, as_json: bool) -> None:
    """Let a tool call awaiting approval run (every pending call of the run without CALL_ID)."""
    _decide(run_id, call_id, True, None, as_json)


@click.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@click.option("--reason", required=True, help="told to the model as the refusal's reason")
@click.option("--json", "as_json", is_flag=True)
def reject(run_id: str, call_id: str | None, reason: str, as_json: bool) -> None:
    """Refuse a tool call awaiting approval; the model hears it was refused, and why."""
    _decide(run_id, call_id, False, reason, as_json)

