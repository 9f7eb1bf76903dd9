"""Custom resources checked against the CRDs vendored under tests/schemas/ (each folder named after the
project and version it was copied from, e.g. keda-2.20.2/): the CRD's openAPIV3Schema with a real JSON-schema
validator (jsonschema; Draft 4, the dialect of OpenAPI 3.0 that structural schemas use), made strict the way
the API server is with `kubectl apply`'s default field validation (an unknown field is an error), and its
`x-kubernetes-validations` rules run by a real CEL evaluator (common-expression-language)."""

from __future__ import annotations

import functools
from typing import Any

import cel
import jsonschema
import yaml

from tests.fixtures_cluster import ROOT

SCHEMAS = ROOT / "tests" / "schemas"


def _strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties and does not
    keep unknown fields (x-kubernetes-preserve-unknown-fields): what Strict field validation enforces."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict openAPIV3Schema of every served version of every vendored CRD."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(SCHEMAS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    found[key] = _strict(version["schema"]["openAPIV3Schema"])
    return found


def _cel_errors(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """The messages of the x-kubernetes-validations rules that `value` breaks, at every level of the schema."""
    errors = [f"{where}: {rule.get('message', rule['rule'])}" for rule in schema.get("x-kubernetes-validations", [])
              if cel.evaluate(rule["rule"], {"self": value}) is not True]
    if isinstance(value, dict):
        for name, sub in value.items():
            child = schema.get("properties", {}).get(name)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                errors += _cel_errors(child, sub, f"{where}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            errors += _cel_errors(schema["items"], sub, f"{where}[{i}]")
    return errors


def crd_errors(doc: dict[str, Any]) -> list[str]:
    """Why the API server would refuse `doc` by its CRD (empty: it is valid). KeyError: no CRD vendored for it."""
    schema = crd_schemas()[(doc["apiVersion"], doc["kind"])]
    validator = jsonschema.Draft4Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(doc)]
    return errors or _cel_errors(schema, doc, "(root)")
