"""`reactq cancel --batch B` (its printing) and `reactq purge --older-than 30d`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from .base import _runtime, error, out
from .display import literal


def cancel_batch_command(batch_id: str, as_json: bool) -> None:
    from ..service.retention import cancel_batch
    from ..tasks.steps import send_step

    store = _runtime().store
    if not store.batches.info(batch_id):
        error(f"no batch {batch_id!r} (unknown id, or its record expired)")
        sys.exit(2)
    counts = cancel_batch(store, batch_id, send_step)
    if as_json:
        out.print_json(json.dumps({"batch_id": batch_id, **counts}))
    else:
        out.print(literal(f"{batch_id}: {counts['cancelled']} run(s) cancelled, "
                          f"{counts['already_finished']} already finished"))


@click.command()
@click.option("--older-than", "older_than", required=True, help="an age: 30d, 12h, 90m, 45s, 2w")
@click.option("--json", "as_json", is_flag=True)
def purge(older_than: str, as_json: bool) -> None:
    """Remove finished runs (every key) and finished batches older than the given age."""
    from ..service.retention import parse_age
    from ..service.retention import purge as sweep

    try:
        seconds = parse_age(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    report = sweep(_runtime().store, seconds)
    if as_json:
        out.print_json(json.dumps(asdict(report)))
    else:
        out.print(f"purged {report.runs} run(s) ({report.keys} keys) and {report.batches} batch(es) "
                  f"finished more than {older_than} ago")

