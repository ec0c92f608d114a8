"""values.schema.json: the defaults pass, bad values are refused by helm with a clear message."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from support.tools import CHART_DIR, run_helm

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"operator": {"replica": 2}},
     "at '/operator': additional properties 'replica' not allowed"),
    ("no replica", {"operator": {"replicas": 0}},
     "at '/operator/replicas': minimum: got 0, want 1"),
    ("short peering lifetime", {"operator": {"peeringLifetimeSeconds": 1}},
     "at '/operator/peeringLifetimeSeconds': minimum: got 1, want 5"),
    ("root user", {"operator": {"podSecurityContext": {"runAsNonRoot": False}}},
     "at '/operator/podSecurityContext/runAsNonRoot': value must be true"),
    ("writable root filesystem", {"operator": {"securityContext": {
        "runAsNonRoot": True, "readOnlyRootFilesystem": False}}},
     "at '/operator/securityContext/readOnlyRootFilesystem': value must be true"),
    ("log level", {"operator": {"logLevel": "loud"}},
     "at '/operator/logLevel': value must be one of 'quiet', 'info', 'verbose', 'debug'"),
    ("pull policy", {"agent": {"image": {"pullPolicy": "Sometimes"}}},
     "at '/agent/image/pullPolicy': value must be one of"),
    ("image repository", {"operator": {"image": {"repository": "Not A Repo"}}},
     "at '/operator/image/repository': 'Not A Repo' does not match pattern"),
    ("port range", {"webhook": {"port": 70000}},
     "at '/webhook/port': maximum: got 70,000, want 65,535"),
    ("namespace name", {"operator": {"watchNamespaces": ["Team_A"]}},
     "at '/operator/watchNamespaces/0': 'Team_A' does not match pattern"),
    ("resource quantity", {"operator": {"resources": {"limits": {"memory": "lots"}}}},
     "at '/operator/resources/limits/memory': 'lots' does not match pattern"),
    ("feature flag type", {"rbac": {"features": {"volumePool": "yes"}}},
     "at '/rbac/features/volumePool': got string, want boolean"),
    # The webhook gives pods pool volumes: without the pool it could only refuse them.
    ("webhook without the volume pool", {"webhook": {"enabled": True}, "rbac": {"features": {
        "podAudit": False, "volumePool": False, "drainJobs": False}}},
     "at '/rbac/features/volumePool': value must be true"),
    # The pool is three flags of one feature: half a pool cannot drain (deletion would hang).
    ("volume pool without drain jobs", {"webhook": {"enabled": False}, "rbac": {"features": {
        "drainJobs": False}}}, "at '/rbac/features/drainJobs': value must be true"),
    ("drain jobs without the volume pool", {"webhook": {"enabled": False}, "rbac": {
        "features": {"volumePool": False, "podAudit": False}}},
     "at '/rbac/features/volumePool': value must be true"),
]


def load_default_values() -> dict[str, Any]:
    return yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def load_values_schema() -> dict[str, Any]:
    return json.loads((CHART_DIR / "values.schema.json").read_text())


def test_default_values_satisfy_the_schema() -> None:
    jsonschema.validate(load_default_values(), load_values_schema())


def test_values_schema_is_a_valid_json_schema() -> None:
    schema = load_values_schema()

    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_every_default_value_is_described_by_the_schema() -> None:
    """A key in values.yaml that the schema does not list would make the defaults invalid."""

    def leaf_paths(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [p for key, child in node.items() for p in leaf_paths(child, f"{prefix}/{key}")]
        return [prefix]

    schema = load_values_schema()
    for path in leaf_paths(load_default_values()):
        node = schema
        for key in path.strip("/").split("/"):
            if "$ref" in node:
                node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
            properties = node.get("properties", {})
            if key not in properties:
                assert isinstance(node.get("additionalProperties"), dict), path
                break
            node = properties[key]


@pytest.mark.parametrize(("bad_values", "message"),
                         [(values, message) for _, values, message in BAD_VALUES],
                         ids=[name for name, _, _ in BAD_VALUES])
def test_helm_template_rejects_bad_values(bad_values: dict[str, Any], message: str) -> None:
    result = run_helm(["template", "dp", str(CHART_DIR)], values=bad_values)

    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_helm_lint_rejects_bad_values_too() -> None:
    _, bad_values, message = BAD_VALUES[0]
    result = run_helm(["lint", str(CHART_DIR)], values=bad_values)

    assert result.returncode != 0
    assert message in result.stdout + result.stderr


@pytest.mark.parametrize("values", [
    {"webhook": {"enabled": False}, "rbac": {"features": {
        "podAudit": False, "volumePool": False, "drainJobs": False}}},
    {"rbac": {"features": {"sparkPodTemplates": False}}},
])  # fmt: skip
def test_consistent_feature_combinations_are_accepted(values: dict[str, Any]) -> None:
    result = run_helm(["template", "dp", str(CHART_DIR)], values=values)

    assert result.returncode == 0, result.stderr
