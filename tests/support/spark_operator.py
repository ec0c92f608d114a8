"""Validate manifests against the vendored spark-operator SparkApplication CRD (an excerpt).

``validate_spark_application`` does what the API server and ``kubectl apply --validate=strict``
would: the openAPIV3Schema's types, enums, minimums and required fields (with jsonschema), and
no field that the schema does not declare (the API server would silently prune it).
See ``spark_operator_crd/README.md`` for the source and what the excerpt keeps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_FILE = (
    Path(__file__).parent
    / "spark_operator_crd"
    / "sparkoperator.k8s.io_sparkapplications.excerpt.yaml"
)
VERSION = "v1beta2"


@cache
def spark_application_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    for version in crd["spec"]["versions"]:
        if version["name"] == VERSION:
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise LookupError(f"no {VERSION} in {CRD_FILE}")


def undeclared_fields(value: Any, schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Paths of fields in ``value`` that ``schema`` does not declare (structural pruning)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or path == ".metadata":
        return  # the root's metadata is an ObjectMeta, validated by the API server itself
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from undeclared_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                yield from undeclared_fields(item, additional, f"{path}.{key}")
            else:
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from undeclared_fields(item, schema["items"], f"{path}[{index}]")


def spark_application_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Everything the API server would refuse or prune; empty when the manifest is valid."""
    schema = spark_application_schema()
    validator = jsonschema.Draft7Validator(schema)
    problems = [
        f"{'.'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]
    problems += [
        f"{field}: not declared in the CRD" for field in undeclared_fields(manifest, schema)
    ]
    if manifest.get("apiVersion") != f"sparkoperator.k8s.io/{VERSION}":
        problems.append(f"apiVersion: {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != "SparkApplication":
        problems.append(f"kind: {manifest.get('kind')!r}")
    return problems
