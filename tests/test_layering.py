"""Which way imports go (docs/DESIGN.md, docs/decisions/layout.md): worker/ is a stack of packages, each importing
only the packages below it; the pure engine (`worker/core/`) imports only itself, `worker.errors`, the
standard library and pydantic; celery, fastapi, click and rich each live in one package; tools_sandbox
is a stack of its own (SANDBOX_LAYERS) by the same rules; tools_sandbox never imports worker and api_stub
imports neither. A module is classified by the folder it is in."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "worker" / "core"

# The package table, bottom first: a package may import only the rows above its own (never one beside it).
LAYERS = [
    "worker.errors",  # the one exception tree (a module at the root, below everything)
    "worker.core",  # the pure engine: models, parser, prompts, the step decision, views, trace diff
    "worker",  # the foundation, the other root modules: config, names, metrics, logs
    "worker.store",  # every Redis read and write
    "worker.llm",  # the model edge: client, HTTP pool, rate limiter, fallback
    "worker.tenancy",  # tenants, plans, budgets and the ledger, admission, fairness
    "worker.tools worker.evals",  # the built-in tools; evaluation scoring, tables and reports
    "worker.runtime",  # the step path: runner, approvals, finish hooks, webhooks, leases, reaper, drain
    "worker.tasks",  # Celery: the app, the transport, the tasks
    "worker.service",  # submit, batches, batch input, replay, retention: what the CLI and API share
    "worker.api",  # the HTTP API
    "worker.cli",  # the command line, its display, the demo and the local stack
]
# `celery -A worker.celery_app` (users' scripts, old deployments) is an alias of worker.tasks.app.
ALIASES = {"worker.celery_app"}
# Each framework is imported by exactly one package of worker/.
FRAMEWORKS = {"celery": "worker.tasks", "kombu": "worker.tasks", "fastapi": "worker.api",
              "starlette": "worker.api", "click": "worker.cli", "rich": "worker.cli"}


def rank_of(package: str) -> int:
    return next(i for i, row in enumerate(LAYERS) if package in row.split())


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports; `from . import a, b` names the submodules a and b."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is None:
            names.update("." * node.level + alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + node.module)
    return names


def resolve(path: Path, name: str) -> str:
    """The dotted module a (possibly relative) import in `path` names."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    base = package[: len(package) - (level - 1)]
    rest = name.lstrip(".")
    return ".".join(base + ([rest] if rest else []))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The package-table row a worker module belongs to, by its folder."""
    if module == "worker.errors":
        return module
    path = ROOT / module.replace(".", "/")
    if path.is_dir():  # a package's __init__
        return module if module == "worker" else ".".join(module.split(".")[:2])
    return ".".join(module.split(".")[:2]) if module.count(".") >= 2 else "worker"


def module_path(module: str) -> Path:
    path = ROOT / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


WORKER_MODULES = sorted(_module_name(p) for p in (ROOT / "worker").rglob("*.py"))


def test_every_package_is_in_the_table() -> None:
    for module in WORKER_MODULES:
        if module not in ALIASES:
            rank_of(package_of(module))  # StopIteration: a folder the table does not name


def package_imports(module: str) -> set[str]:
    """The worker modules `module` imports (lazy ones included), each as the module it names."""
    path = module_path(module)
    targets = set()
    for name in imported_modules(path):
        target = resolve(path, name)
        if target.split(".")[0] == "worker":
            targets.add(target)
    return targets


def _target_package(target: str) -> str:
    while target and target != "worker" and not (ROOT / target.replace(".", "/")).exists() \
            and not (ROOT / (target.replace(".", "/") + ".py")).exists():
        target = target.rpartition(".")[0]  # `from .x import f` names module x
    return package_of(target)


@pytest.mark.parametrize("module", [m for m in WORKER_MODULES if m not in ALIASES])
def test_each_package_imports_only_the_packages_below_it(module: str) -> None:
    here = package_of(module)
    for target in package_imports(module):
        there = _target_package(target)
        if there == here:
            continue
        assert rank_of(there) < rank_of(here), (
            f"{module} ({here}) imports {target} ({there}), which is not below it in tests/test_layering.py LAYERS")


def test_nothing_imports_an_alias() -> None:
    for module in WORKER_MODULES:
        assert not package_imports(module) & ALIASES, f"{module} imports an alias module"


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_each_framework_is_imported_by_one_package(framework: str) -> None:
    importers = {package_of(module) for module in WORKER_MODULES if module not in ALIASES
                 if any(name.split(".")[0] == framework for name in imported_modules(module_path(module)))}
    assert importers <= {FRAMEWORKS[framework]}, f"{framework} is imported outside {FRAMEWORKS[framework]}: {importers}"


# Redis is the store's: reactq's state is read and written only in worker/store. The one other client is
# the Celery broker transport (worker/tasks/broker.py), which carries Celery's messages, not reactq state.
REDIS_CLIENTS = {"worker.store", "worker.tasks.broker"}


def test_only_the_store_and_the_broker_transport_use_redis() -> None:
    for module in WORKER_MODULES:
        if package_of(module) in REDIS_CLIENTS or module in REDIS_CLIENTS:
            continue
        names = {name.split(".")[0] for name in imported_modules(module_path(module)) if not name.startswith(".")}
        assert "redis" not in names, f"{module} imports redis: its reads and writes belong in worker/store"


def test_modules_are_classified_by_their_folder() -> None:
    assert rank_of("worker.runtime") < rank_of("worker.tasks")
    assert package_of("worker.runtime.runner") == "worker.runtime"
    assert package_of("worker.config") == "worker"
    assert package_of("worker.store") == "worker.store"
    assert _target_package("worker.tasks.steps.send_step") == "worker.tasks"


def test_nothing_outside_the_store_reaches_into_its_redis_client() -> None:
    """`something.r` (a store's client) is read only inside worker/store; `self.r` is a class's own."""
    for module in WORKER_MODULES:
        if package_of(module) == "worker.store":
            continue
        for node in ast.walk(ast.parse(module_path(module).read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "r":
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id == "self", (
                    f"{module}:{node.lineno} reads {ast.unparse(node)}: ask the store for what it needs")


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: p.name)
def test_core_imports_only_core_errors_stdlib_and_pydantic(path: Path) -> None:
    for name in imported_modules(path):
        target = resolve(path, name)
        top = target.split(".")[0]
        inside = target == "worker.core" or target.startswith("worker.core.") or target == "worker.errors"
        assert inside or top in sys.stdlib_module_names or top == "pydantic", (
            f"{path.relative_to(ROOT)} imports {target}, which is outside worker/core"
        )


def test_errors_imports_nothing_from_the_package() -> None:
    for name in imported_modules(ROOT / "worker" / "errors.py"):
        top = resolve(ROOT / "worker" / "errors.py", name).split(".")[0]
        assert top in sys.stdlib_module_names, f"worker/errors.py imports {name}"


@pytest.mark.parametrize("package, forbidden", [("tools_sandbox", {"worker", "api_stub"}),
                                                ("api_stub", {"worker", "tools_sandbox"})])
def test_services_do_not_import_each_other(package: str, forbidden: set[str]) -> None:
    for path in (ROOT / package).rglob("*.py"):
        tops = {name.split(".")[0] for name in imported_modules(path) if not name.startswith(".")}
        assert not tops & forbidden, f"{path.relative_to(ROOT)} imports {tops & forbidden}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside a function alike."""
    paths = {_module_name(p): p for package in ("worker", "tools_sandbox", "api_stub")
             for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for name in imported_modules(path):
            target = resolve(path, name)
            while target and target not in paths:  # `from .x import f` names module x
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            if (cycle := visit(target, path + [module])) is not None:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        if (cycle := visit(module, [])) is not None:
            return cycle
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# tools_sandbox/ is a stack by the same rules (its layers are described in tools_sandbox/__init__.py), bottom
# first: a package may import only the rows above its own.
SANDBOX_LAYERS = [
    "tools_sandbox.inside",  # what runs inside the sandbox: the supervisor (_agent.py), standard library only
    "tools_sandbox.base",  # models, errors, settings, tiers, the wire protocol, keys, quotas, metrics, the seam
    "tools_sandbox.backends",  # Docker, the warm pool, the process backend, cgroup reading, the image build
    "tools_sandbox.edges",  # the service (it constructs the backends), backend health, the Celery task, the CLI
    "tools_sandbox",  # the public API (__init__.py) and `python -m tools_sandbox.cli`, an alias of edges/cli.py
]
# Each framework is imported by exactly one package of tools_sandbox/: Redis by the base (the quota gate and
# the calls' records share a sandbox worker's one client), Celery by the edges.
SANDBOX_FRAMEWORKS = {"celery": "tools_sandbox.edges", "kombu": "tools_sandbox.edges",
                      "click": "tools_sandbox.edges", "docker": "tools_sandbox.backends", "redis": "tools_sandbox.base"}
SANDBOX = ROOT / "tools_sandbox"
SANDBOX_MODULES = sorted(_module_name(p) for p in SANDBOX.rglob("*.py"))


def sandbox_package_of(module: str) -> str:
    """The SANDBOX_LAYERS row of a tools_sandbox module (or of a name inside one), by its folder."""
    parts = module.split(".")
    if len(parts) >= 2 and (SANDBOX / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "tools_sandbox"  # the package's __init__ or a module at its root


def sandbox_rank(package: str) -> int:
    return SANDBOX_LAYERS.index(package)


def test_every_sandbox_package_is_in_the_table() -> None:
    folders = {f"tools_sandbox.{p.name}" for p in SANDBOX.iterdir() if (p / "__init__.py").exists()}
    assert folders | {"tools_sandbox"} == set(SANDBOX_LAYERS)


@pytest.mark.parametrize("module", SANDBOX_MODULES)
def test_each_sandbox_package_imports_only_the_packages_below_it(module: str) -> None:
    here = sandbox_package_of(module)
    path = module_path(module)
    for name in imported_modules(path):
        target = resolve(path, name)
        if target.split(".")[0] != "tools_sandbox":
            continue
        there = sandbox_package_of(target)
        assert there == here or sandbox_rank(there) < sandbox_rank(here), (
            f"{module} ({here}) imports {target} ({there}), which is not below it in tests/test_layering.py "
            "SANDBOX_LAYERS")


@pytest.mark.parametrize("path", sorted((SANDBOX / "inside").rglob("*.py")), ids=lambda p: p.name)
def test_what_runs_inside_the_sandbox_imports_only_the_standard_library(path: Path) -> None:
    for name in imported_modules(path):
        top = resolve(path, name).split(".")[0]
        assert top in sys.stdlib_module_names, f"{path.relative_to(ROOT)} imports {name} (the sandbox has the stdlib)"


@pytest.mark.parametrize("framework", sorted(SANDBOX_FRAMEWORKS))
def test_each_framework_is_imported_by_one_sandbox_package(framework: str) -> None:
    importers = {sandbox_package_of(module) for module in SANDBOX_MODULES
                 if any(name.split(".")[0] == framework for name in imported_modules(module_path(module)))}
    assert importers <= {SANDBOX_FRAMEWORKS[framework]}, (
        f"{framework} is imported outside {SANDBOX_FRAMEWORKS[framework]}: {importers}")


def test_the_seam_names_no_concrete_backend() -> None:
    """base/backend.py is what the service holds; the edge (edges/service.py) constructs the backends."""
    path = SANDBOX / "base" / "backend.py"
    assert not {resolve(path, name) for name in imported_modules(path)
                if resolve(path, name).startswith("tools_sandbox.backends")}


def test_sandbox_modules_are_classified_by_their_folder() -> None:
    assert sandbox_package_of("tools_sandbox.base.models.SandboxResult") == "tools_sandbox.base"
    assert sandbox_package_of("tools_sandbox.cli") == "tools_sandbox"
    assert sandbox_package_of("tools_sandbox") == "tools_sandbox"
    assert sandbox_rank("tools_sandbox.base") < sandbox_rank("tools_sandbox.edges")


# Where the environment and the settings may be read: the top of each program (its CLI, its API, its Celery task
# modules) and the settings classes themselves; every module below is passed what it needs. The sandbox's
# supervisor runs inside the container, a program of its own.
SETTINGS_READERS = ("worker/cli/", "worker/api/", "worker/tasks/", "worker/config.py", "tools_sandbox/edges/",
                    "tools_sandbox/base/config.py", "tools_sandbox/inside/", "tools_sandbox/cli.py")
SETTINGS_BUILDERS = {"get_settings", "Settings", "SandboxSettings"}


def _reads_settings_or_environment(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else (
                node.func.attr if isinstance(node.func, ast.Attribute) else "")
            if name in SETTINGS_BUILDERS and not node.args and not node.keywords:
                found.append(f"line {node.lineno}: {name}()")
            if name == "getenv":
                found.append(f"line {node.lineno}: getenv")
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append(f"line {node.lineno}: os.environ")
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv") for a in node.names):
            found.append(f"line {node.lineno}: from os import {', '.join(a.name for a in node.names)}")
    return found


def test_only_the_top_of_each_program_reads_the_environment_or_builds_the_settings() -> None:
    offenders = {}
    for package in ("worker", "tools_sandbox"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(SETTINGS_READERS):
                continue
            if found := _reads_settings_or_environment(ast.parse(path.read_text(encoding="utf-8"))):
                offenders[relative] = found
    assert not offenders, f"settings must be passed in, not read deep: {offenders}"


def test_the_settings_check_sees_each_way_of_reading_them() -> None:
    seen = _reads_settings_or_environment(ast.parse(
        "import os\nfrom os import environ\na = get_settings()\nb = config.SandboxSettings()\n"
        "c = os.environ.get('X')\nd = os.getenv('X')\ne = Settings(tiers=['x'])\n"))
    assert sorted(s.split(":")[0] for s in seen) == ["line 2", "line 3", "line 4", "line 5", "line 6"], seen
