"""Which way imports go (DESIGN.md): the pure engine imports only its own models and pydantic;
tools_sandbox never imports worker; api_stub imports neither."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = ["models", "parser", "engine", "prompts", "pricing", "errors"]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_engine_imports_only_stdlib_pydantic_and_itself(module: str) -> None:
    for name in imported_modules(ROOT / "worker" / f"{module}.py"):
        top = name.lstrip(".").split(".")[0]
        if name.startswith("."):
            assert top in PURE, f"worker/{module}.py imports .{top}, which is not pure"
        else:
            assert top in sys.stdlib_module_names or top == "pydantic", f"worker/{module}.py imports {name}"


@pytest.mark.parametrize("package, forbidden", [("tools_sandbox", {"worker", "api_stub"}),
                                                ("api_stub", {"worker", "tools_sandbox"})])
def test_services_do_not_import_each_other(package: str, forbidden: set[str]) -> None:
    for path in (ROOT / package).rglob("*.py"):
        tops = {name.split(".")[0] for name in imported_modules(path) if not name.startswith(".")}
        assert not tops & forbidden, f"{path.relative_to(ROOT)} imports {tops & forbidden}"
