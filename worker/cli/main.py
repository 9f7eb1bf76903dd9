"""The `reactq` command line: the command group, which imports a verb's module when the verb is run (or
listed by `reactq --help`): `reactq batch` loads neither the API nor the demo nor the sandbox."""

from __future__ import annotations

import gc
import importlib

import click

from ..config import get_settings
from .collector import settle

# Each verb and the module defining it (its attribute of the same name, `eval` excepted); the sandbox group
# comes from tools_sandbox when installed.
VERBS = {
    "worker": "worker.cli.serve", "stub": "worker.cli.serve", "api": "worker.cli.serve",
    "ask": "worker.cli.runs", "batch": "worker.cli.runs", "status": "worker.cli.runs",
    "trace": "worker.cli.runs", "cancel": "worker.cli.runs",
    "demo": "worker.cli.demo",
    "tenant": "worker.cli.tenants", "key": "worker.cli.tenants",
    "approve": "worker.cli.approvals", "reject": "worker.cli.approvals",
    "eval": "worker.cli.evaluate",
    "replay": "worker.cli.replay",
    "purge": "worker.cli.retention",
    "webhook": "worker.cli.webhooks",
    "sandbox": "tools_sandbox.edges.cli",
}
ATTRIBUTES = {"eval": "eval_command"}


class Verbs(click.Group):
    """click's lazily loading group: a verb's module is imported when the verb is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *VERBS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in VERBS:
            return super().get_command(ctx, cmd_name)
        try:
            module = importlib.import_module(VERBS[cmd_name])
        except ImportError:
            if cmd_name == "sandbox":  # tools_sandbox is not installed
                return None
            raise
        command: click.Command = getattr(module, ATTRIBUTES.get(cmd_name, cmd_name))
        self.add_command(command, cmd_name)
        return command

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            resolved = super().resolve_command(ctx, args)
            settle()  # the verb's module is imported: the collector back on (worker/cli/collector.py)
            return resolved
        except click.NoSuchCommand as exc:  # "Did you mean ...?" among every verb, not only the ones loaded
            verbs = [name for name in self.list_commands(ctx) if self.get_command(ctx, name) is not None]
            raise click.NoSuchCommand(exc.command_name, possibilities=verbs, ctx=ctx) from None


@click.group(cls=Verbs)
def cli() -> None:
    """reactq: ReAct agents as durable background jobs on Celery + Redis."""


def main() -> None:
    get_settings()
    try:
        cli()
    finally:
        # The interpreter's teardown runs the cyclic collector over every object the imports made (~60 ms
        # of CPU a command, a sixth of `reactq batch`'s; BENCHMARKS.md): frozen, they are left as they are.
        gc.freeze()


if __name__ == "__main__":
    main()
