"""The `reactq` command line: the command group, and every verb module registering its commands on it."""

from __future__ import annotations

import click

from ..config import get_settings
from . import approvals, demo, evaluate, replay, retention, runs, serve, tenants, webhooks

# Each module adds its verbs with `register(group)`; the sandbox group comes from tools_sandbox when installed.
VERB_MODULES = (serve, runs, demo, tenants, approvals, evaluate, replay, retention, webhooks)


@click.group()
def cli() -> None:
    """reactq: ReAct agents as durable background jobs on Celery + Redis."""


def register(group: click.Group) -> None:
    """Every `reactq` verb on `group`."""
    for module in VERB_MODULES:
        module.register(group)
    try:
        from tools_sandbox.edges.cli import sandbox
    except ImportError:
        return
    group.add_command(sandbox)


register(cli)


def main() -> None:
    get_settings()
    cli()


if __name__ == "__main__":
    main()
