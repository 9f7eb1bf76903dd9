"""A run's event stream (what `GET /v1/runs/{id}/events` follows): entries are appended as commands
of the record writes they describe."""

from __future__ import annotations

from . import keys
from .cas import Command

EVENTS_MAXLEN = 2000


def event_command(run_id: str, kind: str, data: str) -> Command:
    """Append one entry to the run's event stream (as a command of a run-record write)."""
    return ("XADD", keys.events(run_id), "MAXLEN", "~", EVENTS_MAXLEN, "*", "type", kind, "data", data)
