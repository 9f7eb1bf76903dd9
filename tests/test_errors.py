"""One exception tree (worker/errors.py): every exception class of worker/ is defined there, under
ReactqError, and the tree drawn in its docstring names each one beneath its real parent."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from worker import errors

ROOT = Path(__file__).resolve().parent.parent


def _exception_classes() -> dict[str, type[BaseException]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == errors.__name__}


def test_no_module_but_errors_defines_an_exception() -> None:
    ours = set(_exception_classes())
    for path in (ROOT / "worker").rglob("*.py"):
        if path.name == "errors.py" and path.parent.name == "worker":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                assert not bases & (ours | {"Exception", "BaseException", "ValueError", "RuntimeError"}), (
                    f"{path.relative_to(ROOT)} defines exception {node.name}: it belongs in worker/errors.py")


def test_every_exception_is_a_reactq_error() -> None:
    for name, cls in _exception_classes().items():
        assert issubclass(cls, errors.ReactqError), f"{name} is not under ReactqError"


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn: dict[str, str] = {}  # class -> the class drawn above it
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^(\s*(?:[│ ]\s*)*)(?:[├└]── )?([A-Z]\w+)\b", line)
        if match is None or match[2] not in _exception_classes():
            continue
        depth = len(match[1]) + (4 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[match[2]] = stack[-1][1] if stack else ""
        stack.append((depth, match[2]))
    for name, cls in _exception_classes().items():
        assert name in drawn, f"{name} is missing from the tree in worker/errors.py's docstring"
        if cls is not errors.ReactqError:
            parents = {base.__name__ for base in cls.__bases__}
            assert drawn[name] in parents, f"{name} is drawn under {drawn[name]}, but its parents are {parents}"
