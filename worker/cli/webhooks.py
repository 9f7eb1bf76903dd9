"""`reactq webhook set-default TENANT URL`, `webhook secret TENANT [--rotate]`, `webhook deliveries`."""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from .base import _runtime, error, out
from .display import literal


@click.group()
def webhook() -> None:
    """Tenants' default webhook URL and signing secret; delivery log."""


def _tenant(name: str) -> str:
    """The id of the tenant named `name` (any tenant: of REACTQ_TENANTS or added with `reactq tenant add`)."""
    tenants = _runtime().tenants
    tenant_id = tenants.id_of(name)
    if tenant_id is None or not tenants.exists(tenant_id):
        error(f"unknown tenant {name!r}; known tenants: {', '.join(tenants.names())}")
        sys.exit(2)
    return tenant_id


@webhook.command("set-default")
@click.argument("tenant")
@click.argument("url", required=False)
@click.option("--clear", is_flag=True, help="remove the tenant's default URL")
def set_default(tenant: str, url: str | None, clear: bool) -> None:
    """Call URL when any of TENANT's runs (outside a batch) or batches finishes, unless it names its own."""
    from ..errors import InvalidRequest
    from ..runtime.webhooks import set_default_url

    store = _runtime().webhooks
    if clear == (url is not None):
        raise click.UsageError("give a URL, or --clear")
    tenant_id = _tenant(tenant)
    try:
        set_default_url(store, tenant_id, None if clear else url)
    except InvalidRequest as exc:
        error(exc)
        sys.exit(2)
    store.secret(tenant_id)  # exists from now on, so the receiver can be configured before the first call
    out.print(literal(f"{tenant}: default webhook {'cleared' if clear else url}; "
                      f"signing secret: `reactq webhook secret {tenant}`"))


@webhook.command()
@click.argument("tenant")
@click.option("--rotate", is_flag=True, help="replace the secret (deliveries from now on use the new one)")
def secret(tenant: str, rotate: bool) -> None:
    """Print TENANT's webhook signing secret (HMAC-SHA256 key of X-Reactq-Signature)."""
    out.print(_runtime().webhooks.secret(_tenant(tenant), rotate=rotate))


@webhook.command()
@click.option("--tenant", default="default", show_default=True)
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def deliveries(tenant: str, limit: int, as_json: bool) -> None:
    """The tenant's latest deliveries with every attempt's status."""
    found = _runtime().webhooks.list(_tenant(tenant), limit)
    if as_json:
        out.print_json(json.dumps([d.public() for d in found]))
        return
    table = Table(title=f"webhook deliveries of {tenant}")
    for column in ("id", "event", "subject", "url", "state", "attempts", "last"):
        table.add_column(column, overflow="fold")
    for d in found:
        last = d.attempts[-1] if d.attempts else None
        table.add_row(*map(literal, (d.id, d.event.value, d.subject_id, d.url, d.state.value, len(d.attempts),
                                     "" if last is None else (last.error or last.status_code))))
    out.print(table)

