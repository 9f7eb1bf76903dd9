"""Lua scripts live in `.lua` files beside the module that loads them (read once, at import)."""

from __future__ import annotations

from pathlib import Path


def lua(module_file: str, name: str, **values: object) -> str:
    """The text of `name` beside `module_file` (a module's `__file__`); each `{{KEY}}` in it is replaced by
    `values[KEY]` (a constant the Python side also uses)."""
    text = (Path(module_file).parent / name).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    return text
