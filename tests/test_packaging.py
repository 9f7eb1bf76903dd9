"""The test command and the images install what the suite ran with: deploy/constraints.txt (the lock) pins
every dependency of pyproject.toml, runtime and test extra (within its range); scripts/test.sh and both
Dockerfiles install with it; and every third-party module reactq imports is a declared dependency (httpcore
was once used and undeclared)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
PACKAGES = ["worker", "tools_sandbox", "api_stub"]


def runtime_requirements() -> list[Requirement]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(r) for r in pyproject["project"]["dependencies"]]


def locked_requirements() -> list[Requirement]:
    """What the lock must pin: the runtime dependencies and the test extra (scripts/test.sh installs both)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return runtime_requirements() + [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["test"]]


def pins() -> dict[str, Version]:
    pinned: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"deploy/constraints.txt: {line!r} is not an exact pin (name==version)"
            pinned[canonicalize_name(name)] = Version(version)
    return pinned


@pytest.mark.parametrize("requirement", locked_requirements(), ids=str)
def test_every_dependency_is_pinned_within_its_range(requirement: Requirement) -> None:
    pinned = pins()
    name = canonicalize_name(requirement.name)
    assert name in pinned, f"{requirement} has no pin in deploy/constraints.txt (scripts/freeze_constraints.py)"
    assert requirement.specifier.contains(pinned[name], prereleases=True), \
        f"deploy/constraints.txt pins {name}=={pinned[name]}, outside pyproject.toml's {requirement}"


def test_the_test_command_installs_with_the_lock() -> None:
    installs = [line for line in (ROOT / "scripts" / "test.sh").read_text().splitlines() if "pip install" in line]
    assert installs and all('-c "${REACTQ_CONSTRAINTS:-deploy/constraints.txt}"' in line for line in installs)


@pytest.mark.parametrize("dockerfile", ["deploy/Dockerfile", "deploy/stack/app.Dockerfile"])
def test_the_dockerfiles_install_with_the_constraints(dockerfile: str) -> None:
    installs = [line for line in (ROOT / dockerfile).read_text().splitlines() if "pip install" in line]
    assert installs, dockerfile
    for line in installs:
        if "--no-deps" not in line:  # the project's own wheel, its dependencies already installed
            assert "-c /tmp/constraints.txt" in line, f"{dockerfile}: {line.strip()!r} installs unpinned"


def imported_top_level_modules() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PACKAGES)


def test_every_imported_third_party_module_is_a_declared_dependency() -> None:
    declared = {canonicalize_name(r.name) for r in runtime_requirements()}
    providers = metadata.packages_distributions()
    undeclared = {}
    for module in sorted(imported_top_level_modules()):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if dists and not dists & declared:
            undeclared[module] = sorted(dists)
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"
    assert {"httpcore", "starlette"} <= declared
