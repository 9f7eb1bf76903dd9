"""A run's output schema at the edges (docs/decisions/structured-output.md): checked when a run is submitted
(it comes from a client: a size bound, a valid JSON Schema, an object at its root, no reference outside
itself) and turned into the `OutputCheck` the engine validates answers with (worker/core/structured.py).

Validation never fetches anything: every validator gets an empty `referencing.Registry` (jsonschema's default
one would still download a remote `$ref`, with a deprecation warning), and a schema with a `$ref` that is not
a local `#...` pointer, or with `$id`/`$dynamicRef`/`$recursiveRef`, is refused at submission."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    exceptions,
)
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

MAX_OUTPUT_SCHEMA_BYTES = 16_384  # the schema as compact JSON
MAX_SCHEMA_DEPTH = 32  # nested objects and lists
_REFUSED_KEYWORDS = ("$id", "$dynamicRef", "$recursiveRef")
_DIALECTS = {str(v.META_SCHEMA.get("$id") or v.META_SCHEMA.get("id")).rstrip("#")
             for v in (Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator)}


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be a run's output schema, or None if it can."""
    if not isinstance(schema, dict):
        return "output_schema must be a JSON object (a JSON Schema)"
    try:
        size = len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode())
    except UnicodeEncodeError:  # JSON may spell a lone surrogate ("\\ud800"): no stored record can hold it
        return "output_schema is not valid Unicode text (a lone surrogate)"
    except (ValueError, RecursionError):  # NaN or Infinity, or nested beyond what JSON encoding allows
        return "output_schema must be plain JSON (no NaN or Infinity) nested at most 32 levels"
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        return f"output_schema has {size} bytes as JSON; the limit is {MAX_OUTPUT_SCHEMA_BYTES}"
    if (outside := _reference_problem(schema, schema, 0)) is not None:
        return f"output_schema {outside}"
    if schema.get("type") != "object":
        return 'output_schema must describe an object: its root needs "type": "object"'
    dialect = schema.get("$schema")
    if dialect is not None and (not isinstance(dialect, str) or dialect.rstrip("#") not in _DIALECTS):
        return f"output_schema's $schema must name a JSON Schema draft ({', '.join(sorted(_DIALECTS))})"
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "its root"
        return f"output_schema is not a valid JSON Schema (at {where}): {exc.message[:200]}"
    return None


def _reference_problem(node: Any, root: dict[str, Any], depth: int) -> str | None:
    if depth > MAX_SCHEMA_DEPTH:
        return f"is nested more than {MAX_SCHEMA_DEPTH} levels deep"
    if isinstance(node, list):
        return next((p for item in node if (p := _reference_problem(item, root, depth + 1)) is not None), None)
    if not isinstance(node, dict):
        return None
    for keyword in _REFUSED_KEYWORDS:
        if isinstance(node.get(keyword), str):
            return f"uses {keyword}, which is not supported: keep the schema in one document"
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"has a $ref outside itself ({ref[:80]!r}); only local references ('#/...') are allowed"
    if isinstance(ref, str) and not _resolves(root, ref):
        return f"has a $ref that points at nothing in it ({ref[:80]!r})"
    return next((p for value in node.values() if (p := _reference_problem(value, root, depth + 1)) is not None),
                None)


def _resolves(root: dict[str, Any], ref: str) -> bool:
    """Whether a local `#/a/b` JSON pointer finds something in `root` (a `#name` anchor is left to the
    validator: an unresolvable one is an answer that cannot be checked)."""
    if ref != "#" and not ref.startswith("#/"):
        return True
    node: Any = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


class JsonSchemaCheck:
    """The engine's OutputCheck (worker/core/structured.py), on the jsonschema library."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._validator: Validator = validator_for(schema, default=Draft202012Validator)(schema,
                                                                                        registry=Registry())

    def problem(self, value: Any) -> str | None:
        try:
            error = exceptions.best_match(self._validator.iter_errors(value))
        except Unresolvable:  # jsonschema wraps an unresolvable $ref (an unknown anchor) in a subclass of it
            return "the answer could not be checked: the schema has a reference that does not resolve"
        except RecursionError:  # {"$ref": "#"} at the root: a schema that refers to itself without end
            return "the answer could not be checked: the schema refers to itself without end"
        if error is None:
            return None
        return f"at {error.json_path}: {error.message}"


@lru_cache(maxsize=256)
def _cached(text: str) -> JsonSchemaCheck:
    return JsonSchemaCheck(json.loads(text))


def output_check(schema: Mapping[str, Any] | None) -> JsonSchemaCheck | None:
    """The check of a run's schema (built once per schema per process), or None for a run without one."""
    if schema is None:
        return None
    return _cached(json.dumps(schema, sort_keys=True))
