"""The contract in docs/DESIGN.md against the code, both ways: each table under a fixed `####` heading
lists exactly what the code has. A verb, flag, setting, route, metric (name, type, labels), run status
or batch line field the code gains without its row fails here, and so does a row with nothing behind
it. The code side is found by introspection (the click command tree, the settings models' fields, the
API app's routes, the metric objects, the enum, the batch line model), never by a list kept here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
CELL = re.compile(r"(?<!\\)\|")  # a cell border: a `|` not escaped as `\|`
TICKED = re.compile(r"`([^`]+)`")

Table = list[dict[str, str]]


def table(heading: str) -> Table:
    """The rows (column name -> cell text) of the first table after the line `#### {heading}` and before
    the next heading: the doc's tables are found by these fixed headings."""
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"#### {heading}"]
    assert len(starts) == 1, f"docs/DESIGN.md has {len(starts)} `#### {heading}` headings, wants exactly one"
    rows: list[list[str]] = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in CELL.split(line.strip().strip("|"))])
        elif rows:
            break  # the table ended
    assert len(rows) >= 2, f"docs/DESIGN.md `#### {heading}` is followed by no table"
    header, body = rows[0], rows[2:]  # rows[1] is the |---| line
    for row in body:
        assert len(row) == len(header), f"docs/DESIGN.md `#### {heading}`: a row has {len(row)} cells, not " \
                                        f"{len(header)}: {row}"
    return [dict(zip(header, row, strict=True)) for row in body]


def ticked(cell: str) -> list[str]:
    """The backticked names of a cell (the rest of a cell is for people)."""
    return TICKED.findall(cell)


def one_name(row: dict[str, str], column: str, heading: str) -> str:
    names = ticked(row[column])
    assert len(names) == 1, f"docs/DESIGN.md `#### {heading}`: the {column} cell {row[column]!r} names " \
                            f"{len(names)} things in backticks, wants one"
    return names[0]


def keyed(rows: Table, column: str, heading: str) -> dict[str, dict[str, str]]:
    by_name: dict[str, dict[str, str]] = {}
    for row in rows:
        name = one_name(row, column, heading)
        assert name not in by_name, f"docs/DESIGN.md `#### {heading}` has two rows for {name}"
        by_name[name] = row
    return by_name


def both_ways(heading: str, documented: set[Any], in_code: set[Any], where: str) -> None:
    """Each side has exactly what the other has; a difference is named with where it is missing."""
    missing = sorted(map(str, in_code - documented))
    extra = sorted(map(str, documented - in_code))
    assert not missing, f"in {where} but no row under docs/DESIGN.md `#### {heading}`: {missing}"
    assert not extra, f"rows under docs/DESIGN.md `#### {heading}` with nothing in {where}: {extra}"


def yes_no(row: dict[str, str], column: str, heading: str) -> bool:
    assert row[column] in ("yes", "no"), \
        f"docs/DESIGN.md `#### {heading}`: {column} is {row[column]!r}, wants yes or no"
    return row[column] == "yes"


# -- CLI verbs and flags ------------------------------------------------------------------------------------

def commands(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    """Every command below `group` by its full name (`reactq tenant add`); groups are not commands."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # `reactq` loads its verbs when asked for them (worker/cli/main.py)
        command = group.get_command(ctx, name)
        if command is None:  # the sandbox group without tools_sandbox
            continue
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")
        else:
            yield f"{path} {name}", command


def parameter(param: click.Parameter) -> frozenset[str]:
    """An option as the set of its spellings (`--concurrency`, `-c`); an argument as its name in capitals."""
    if isinstance(param, click.Option):
        return frozenset(param.opts + param.secondary_opts)
    return frozenset([param.human_readable_name])


def documented_parameter(token: str) -> frozenset[str]:
    return frozenset(token.split("/")) if token.startswith("-") else frozenset([token])


def show(spellings: frozenset[str]) -> str:
    return "/".join(sorted(spellings, key=lambda s: (not s.startswith("--"), s)))


def test_cli_verbs_and_flags() -> None:
    from worker.cli.main import cli

    heading = "CLI verbs and flags"
    rows = keyed(table(heading), "command", heading)
    in_code = dict(commands(cli, "reactq"))
    both_ways(heading, set(rows), set(in_code), "the `reactq` click command tree (worker/cli)")
    for name, command in in_code.items():
        row = rows[name]
        cell = row["arguments and flags"]
        documented = {documented_parameter(token) for token in ticked(cell)}
        params = {parameter(p): p for p in command.params}
        both_ways(heading, {show(d) for d in documented}, {show(p) for p in params},
                  f"the parameters of `{name}`")
        for spellings, param in params.items():
            hidden = bool(getattr(param, "hidden", False))
            marked = bool(re.search(rf"`{re.escape(_token_in(cell, spellings))}` \(hidden\)", cell))
            assert hidden == marked, (
                f"docs/DESIGN.md `#### {heading}`, `{name}`: `{show(spellings)}` is "
                f"{'hidden' if hidden else 'shown'} in --help, so {'mark' if hidden else 'do not mark'} it (hidden)")


def _token_in(cell: str, spellings: frozenset[str]) -> str:
    return next(token for token in ticked(cell) if documented_parameter(token) == spellings)


# -- Settings -----------------------------------------------------------------------------------------------

def variables(settings: type[BaseSettings]) -> set[str]:
    """The environment variable of each field: its alias when it has one, else the prefix + its name."""
    prefix = settings.model_config.get("env_prefix", "")
    names: set[str] = set()
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        names.add(alias if isinstance(alias, str) else f"{prefix}{name}".upper())
    return names


def test_settings() -> None:
    from tools_sandbox.base.config import SandboxSettings
    from worker.config import Settings

    heading = "Settings"
    rows = keyed(table(heading), "variable", heading)
    declared = {"worker": variables(Settings), "sandbox": variables(SandboxSettings)}
    both_ways(heading, set(rows), declared["worker"] | declared["sandbox"],
              "worker/config.py Settings or tools_sandbox/base/config.py SandboxSettings")
    for variable, row in rows.items():
        documented = {part.strip() for part in row["declared in"].split(",")}
        in_code = {where for where, names in declared.items() if variable in names}
        assert documented == in_code, (
            f"docs/DESIGN.md `#### {heading}`: {variable} is declared in {sorted(in_code)} "
            f"(worker: worker/config.py, sandbox: tools_sandbox/base/config.py), the row says {sorted(documented)}")


# -- HTTP routes --------------------------------------------------------------------------------------------

def routes(app: Any) -> set[str]:
    """`METHOD /path` of every route of `app`, routers included; HEAD beside GET is the framework's."""
    try:  # FastAPI that keeps included routers as they are: their routes through public route contexts
        from fastapi.routing import iter_route_contexts

        found = [(ctx.methods, ctx.path) for ctx in iter_route_contexts(app.routes)]
    except ImportError:
        found = [(getattr(route, "methods", None), route.path) for route in app.routes]
    pairs: set[str] = set()
    for methods, path in found:
        assert methods, f"the API app has a route without methods (a mount?) at {path}: give it a row form"
        pairs |= {f"{method} {path}" for method in methods if not (method == "HEAD" and "GET" in methods)}
    return pairs


def test_http_routes() -> None:
    from worker.api.app import create_app
    from worker.config import Settings
    from worker.runtime.context import Runtime

    heading = "HTTP routes"
    documented: set[str] = set()
    for row in table(heading):
        pair = f"{one_name(row, 'method', heading)} {one_name(row, 'path', heading)}"
        assert pair not in documented, f"docs/DESIGN.md `#### {heading}` has two rows for {pair}"
        documented.add(pair)
    app = create_app(Runtime(Settings()))  # nothing connects until a request or the lifespan
    both_ways(heading, documented, routes(app), "the routes of worker.api.app.create_app's app")


# -- Metrics ------------------------------------------------------------------------------------------------

def modules(package: str) -> Iterator[ModuleType]:
    """Every module of `package` but `__main__` (which runs its command when imported)."""
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            yield importlib.import_module(info.name)


def exposed(metric: MetricWrapperBase) -> tuple[str, str, frozenset[str]]:
    """(name as Prometheus shows it, type, label names) of a metric object."""
    family = metric.describe()[0]
    name = f"{family.name}_total" if family.type == "counter" else family.name
    return name, family.type, frozenset(metric._labelnames)  # no public accessor for a metric's label names


def metrics_in_code() -> dict[str, tuple[str, frozenset[str]]]:
    objects: list[MetricWrapperBase] = []
    for package in ("worker", "tools_sandbox", "api_stub"):
        for module in modules(package):
            objects += [value for value in vars(module).values() if isinstance(value, MetricWrapperBase)]
    from api_stub.server import create_app as create_stub

    stub_metrics = create_stub().state.stub.metrics  # the stub keeps a registry of its own per app
    objects += [value for value in vars(stub_metrics).values() if isinstance(value, MetricWrapperBase)]
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for metric in objects:
        name, kind, labels = exposed(metric)
        assert found.get(name, (kind, labels)) == (kind, labels), f"two metrics named {name} differ"
        found[name] = (kind, labels)
    # a metric registered but held by no module-level name (made in a function) must not slip past
    registered = {family.name for family in REGISTRY.collect() if family.name.startswith("reactq_")}
    unseen = registered - {name.removesuffix("_total") for name in found} - set(found)
    assert not unseen, f"reactq metrics in the default registry that no module holds at module level: {unseen}"
    return found


def test_metrics() -> None:
    heading = "Metrics"
    rows = keyed(table(heading), "name", heading)
    in_code = metrics_in_code()
    both_ways(heading, set(rows), set(in_code),
              "the prometheus_client metrics of worker, tools_sandbox and api_stub")
    for name, (kind, labels) in in_code.items():
        row = rows[name]
        assert row["type"] == kind, f"docs/DESIGN.md `#### {heading}`: {name} is a {kind}, the row says {row['type']!r}"
        both_ways(heading, set(ticked(row["labels"])), set(labels), f"the label names of {name}")


# -- Run statuses -------------------------------------------------------------------------------------------

def test_run_statuses() -> None:
    from worker.core.models import RunStatus

    heading = "Run statuses"
    rows = keyed(table(heading), "status", heading)
    both_ways(heading, set(rows), {status.value for status in RunStatus}, "worker/core/models.py RunStatus")
    for status in RunStatus:
        assert yes_no(rows[status.value], "finished", heading) == status.finished, (
            f"docs/DESIGN.md `#### {heading}`: {status.value} is {'' if status.finished else 'not '}finished "
            "(RunStatus.finished)")


# -- Batch lines --------------------------------------------------------------------------------------------

def test_batch_input_line_fields() -> None:
    from worker.service.batch_input import BatchLine

    heading = "Batch input line fields"
    rows = keyed(table(heading), "field", heading)
    both_ways(heading, set(rows), set(BatchLine.model_fields), "worker/service/batch_input.py BatchLine")
    for name, field in BatchLine.model_fields.items():
        assert yes_no(rows[name], "required", heading) == field.is_required(), (
            f"docs/DESIGN.md `#### {heading}`: {name} is {'' if field.is_required() else 'not '}required in BatchLine")


def test_batch_output_line_fields() -> None:
    from worker.core.models import Run, RunSpec

    heading = "Batch output line fields"
    rows = keyed(table(heading), "field", heading)
    line = Run(spec=RunSpec(question="?")).result_line()
    both_ways(heading, set(rows), set(line), "worker/core/models.py Run.result_line()")


# -- Plans and MCP servers ---------------------------------------------------------------------------------

def test_plan_fields() -> None:
    from worker.tenancy.plans import Plan

    heading = "Plan fields"
    rows = keyed(table(heading), "field", heading)
    both_ways(heading, set(rows), set(Plan.model_fields) - {"name"}, "worker/tenancy/plans.py Plan")


def test_mcp_server_entry_fields() -> None:
    from worker.config import McpServerSpec

    heading = "MCP server entry fields"
    rows = keyed(table(heading), "field", heading)
    both_ways(heading, set(rows), set(McpServerSpec.model_fields), "worker/config.py McpServerSpec")


# -- the tables themselves ----------------------------------------------------------------------------------

@pytest.mark.parametrize("heading", ["CLI verbs and flags", "Settings", "HTTP routes", "Metrics", "Run statuses",
                                     "Batch input line fields", "Batch output line fields", "Plan fields",
                                     "MCP server entry fields"])
def test_a_table_is_found_by_its_heading(heading: str) -> None:
    assert table(heading), f"docs/DESIGN.md `#### {heading}` has a table with no rows"
