"""Which way imports go (DESIGN.md): the pure engine (`worker/core/`) imports only itself,
`worker.errors`, the standard library and pydantic; tools_sandbox never imports worker; api_stub
imports neither."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "worker" / "core"


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


# The step path: what a worker runs. The app around it (cli, api, batch, demo, display, submit,
# services, metrics_server and later entry points) may import it, never the other way (NOTES.md,
# "Layout").
RUNTIME = {"runner", "tasks", "celery_app", "runtime", "store", "store_cas", "store_cluster", "leases", "llm",
           "sandbox_bridge", "reaper", "metrics", "logs", "names", "keys", "config", "errors", "budgets", "plans",
           "tenants", "approvals", "finish_hooks", "webhooks", "webhook_tasks", "retention", "submit", "display",
           "admission", "ratelimit", "routing", "fairness", "drain", "broker", "llm_http"}


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_the_step_path_imports_nothing_from_the_app_around_it(name: str) -> None:
    path = ROOT / "worker" / f"{name}.py"
    for imported in imported_modules(path):
        target = resolve(path, imported)
        if not target.startswith("worker.") or target.startswith(("worker.core", "worker.tools")):
            continue
        assert target.split(".")[1] in RUNTIME, f"worker/{name}.py imports {target}, which is app, not runtime"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
