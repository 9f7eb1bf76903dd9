"""`reactq tenant ...` and `reactq key ...`: the operator manages tenants, their plans and API keys."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from ..core.tenant_ids import tenant_name
from ..tenancy.plans import BUDGET_FIELDS
from .base import _runtime, console, error


def _rt() -> Any:
    return _runtime()


def _fail(message: object) -> NoReturn:
    error(message)
    sys.exit(2)


def _budget_options(func: Any) -> Any:
    for field in reversed(BUDGET_FIELDS):
        kind = int if field.startswith("tokens") else float
        func = click.option(f"--{field.replace('_', '-')}", field, type=kind, default=None,
                            help=f"override the plan's {field.replace('_', ' ')} (0: no limit)")(func)
    return click.option("--reset-budgets", is_flag=True, help="drop every override: the plan's budgets apply")(func)


@click.group()
def tenant() -> None:
    """Manage tenants: each has a plan (tiers, tools, budgets, admission limits)."""


@tenant.command("add")
@click.argument("name")
@click.option("--plan", required=True, help="a plan of the plans file (free, standard, pro, ...)")
def tenant_add(name: str, plan: str) -> None:
    """Add a tenant with a plan."""
    from ..errors import InvalidRequest

    try:
        tenant_id = _rt().tenants.add(name, plan)
    except InvalidRequest as exc:
        _fail(exc)
    click.echo(f"tenant {name} (id {tenant_id}) added on plan {plan}; create its API key with: "
               f"reactq key create {name}")


@tenant.command("list")
@click.option("--json", "as_json", is_flag=True)
def tenant_list(as_json: bool) -> None:
    """Every tenant with its id and plan (those of REACTQ_TENANTS included)."""
    tenants = _rt().tenants
    rows = []
    for tenant_id in tenants.ids():
        policy = tenants.policy(tenant_id)
        rows.append({"tenant": tenant_name(tenant_id), "id": tenant_id, "plan": policy.plan.name if policy else None,
                     "overrides": tenants.overrides(tenant_id), "keys": len(tenants.list_keys(tenant_id))})
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        extra = " ".join(f"{k}={v}" for k, v in row["overrides"].items())
        click.echo(f"{row['tenant']}\t{row['id']}\t{row['plan']}\tkeys={row['keys']}" + (f"\t{extra}" if extra else ""))


@tenant.command("set")
@click.argument("name")
@click.option("--plan", default=None, help="move the tenant to this plan")
@_budget_options
def tenant_set(name: str, plan: str | None, reset_budgets: bool, **budgets: float | None) -> None:
    """Change a tenant's plan or its budget overrides."""
    from ..errors import InvalidRequest

    overrides: dict[str, float | None] = {k: v for k, v in budgets.items() if v is not None}
    if reset_budgets:
        overrides = {field: None for field in BUDGET_FIELDS}
    try:
        _rt().tenants.set(name, plan, overrides)
    except InvalidRequest as exc:
        _fail(exc)
    click.echo(f"tenant {name} updated")


@tenant.command("remove")
@click.argument("name")
@click.option("--purge", is_flag=True, help="delete its runs, batches, deliveries, reports and counters now "
                                           "(default: they expire with retention)")
def tenant_remove(name: str, purge: bool) -> None:
    """Remove a tenant: revoke its API keys (refused from their next request on, open event streams and UI
    sessions included), drop its plan, overrides and webhook secret, cancel its unfinished runs. Its data
    expires with retention, or goes now with --purge; a tenant added later with this name sees none of it."""
    from ..errors import InvalidRequest
    from ..service.tenant_removal import end_data
    from ..store.tenant_data import TenantData
    from .base import _send_step

    rt = _rt()
    try:
        tenant_id, revoked = rt.tenants.remove(name)
    except InvalidRequest as exc:
        _fail(exc)
    still_listed = tenant_id in rt.settings.tenants
    end = end_data(rt.store, TenantData(rt.redis), tenant_id, rt.tenants.records.inflight_run_ids(tenant_id),
                   purge=purge, keep_s=None if still_listed else rt.settings.retention_s,
                   wake=_send_step())
    kept = ("its data was deleted" if purge else
            "its data is kept until retention expires it (`--purge` deletes it at once)")
    click.echo(f"tenant {name} (id {tenant_id}) removed: {len(revoked)} API key(s) revoked, "
               f"{end.cancelled} unfinished run(s) cancelled; {kept}")
    if still_listed:
        console.print(f"[yellow]warning:[/yellow] {name} is still listed in REACTQ_TENANTS, so it still exists "
                      "(without keys); remove it there too")


@tenant.command("usage")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def tenant_usage(name: str, as_json: bool) -> None:
    """A tenant's spend against its budgets, today and this month."""
    from ..tenancy.budgets import usage_report

    rt = _rt()
    tenant_id = rt.tenants.id_of(name)
    policy = None if tenant_id is None else rt.tenants.policy(tenant_id)
    if policy is None:
        _fail(f"no tenant {name!r}")
    report = usage_report(rt.budgets, policy)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"tenant {report['tenant']} (plan {report['plan']}), {report['runs_in_flight']} runs in flight")
    for period in ("day", "month"):
        p = report[period]
        tokens = f"{p['tokens']} / {p['tokens_budget'] or 'no limit'} tokens"
        usd = f"${p['usd']:.4f} / " + (f"${p['usd_budget']:.2f}" if p["usd_budget"] else "no limit")
        click.echo(f"  this {period}: {tokens}, {usd} (resets {p['resets_at']})")
    total = report["total"]
    click.echo(f"  all time: {total['prompt_tokens']} prompt + {total['completion_tokens']} completion tokens, "
               f"${total['cost_usd']:.4f}")


@click.group()
def key() -> None:
    """Manage API keys (stored only as hashes)."""


@key.command("create")
@click.argument("name", required=False)
@click.option("--operator", is_flag=True, help="a key for the operator UI (/ui): every tenant's runs, no /v1 routes")
@click.option("--json", "as_json", is_flag=True, help='print {"tenant", "key_id", "key"}')
def key_create(name: str | None, operator: bool, as_json: bool) -> None:
    """Create an API key for tenant NAME (or, with --operator, for the operator UI); the key is printed
    once, as the last line."""
    from ..errors import InvalidRequest

    if operator == (name is not None):
        raise click.UsageError("give a tenant NAME, or --operator (not both)")
    try:
        new = _rt().tenants.create_operator_key() if operator else _rt().tenants.create_key(str(name))
    except InvalidRequest as exc:
        _fail(exc)
        return
    if as_json:
        shown = {"tenant": new.tenant or None, "key_id": new.key_id, "key": new.key}
        click.echo(json.dumps({**shown, "operator": True} if operator else shown))
        return
    if operator:
        click.echo(f"operator key {new.key_id}; it is shown only now (sign in with it at /ui; it authorises "
                   "no /v1 route):")
    else:
        click.echo(f"API key {new.key_id} for tenant {new.tenant}; it is shown only now (send it as "
                   "'Authorization: Bearer KEY'):")
    click.echo(new.key)


@key.command("list")
@click.argument("name", required=False)
@click.option("--operator", is_flag=True, help="the operator keys")
@click.option("--json", "as_json", is_flag=True)
def key_list(name: str | None, operator: bool, as_json: bool) -> None:
    """A tenant's key ids (or, with --operator, the operator keys'; never the keys), with when each was
    created or revoked."""
    if operator == (name is not None):
        raise click.UsageError("give a tenant NAME, or --operator (not both)")
    rows = _rt().tenants.list_keys(None if operator else name)
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        click.echo(f"{row['key_id']}\t{'revoked' if row['revoked_at'] else 'active'}")


@key.command("revoke")
@click.argument("key_id")
def key_revoke(key_id: str) -> None:
    """Revoke a key: every API process refuses it from its next request on."""
    from ..errors import InvalidRequest

    try:
        owner = _rt().tenants.revoke(key_id)
    except InvalidRequest as exc:
        _fail(exc)
        return
    click.echo(f"key {key_id} of tenant {tenant_name(owner)} revoked" if owner else f"operator key {key_id} revoked")

