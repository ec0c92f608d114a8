"""The committed CRD is the one generated from the model, is structural and valid Kubernetes."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from durable_producer.contract import DEFAULT_MAX_BATCH_BYTES
from durable_producer.operator import crd
from durable_producer.operator.decide.sizing import minimum_volume_bytes
from durable_producer.operator.model import model
from durable_producer.operator.model.quantities import MIB
from support.crd_validation import CelRules

REPOSITORY = Path(__file__).resolve().parents[3]
CRD_PATH = REPOSITORY / "crds" / crd.CRD_FILE_NAME
KUBERNETES_VERSION = "1.30"

# Keywords that a structural schema (or pydantic's raw output) must not leave in the CRD.
FORBIDDEN_KEYWORDS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "additionalProperties"}


def committed_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def schema_nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path or "<root>", node)]
    for name, child in node.get("properties", {}).items():
        found.extend(schema_nodes(child, f"{path}.{name}"))
    if "items" in node:
        found.extend(schema_nodes(node["items"], f"{path}[]"))
    return found


def test_committed_crd_equals_generated() -> None:
    assert CRD_PATH.read_text() == crd.render_yaml(), (
        f"crds/ is stale: run `python -m durable_producer.operator.crd > crds/{crd.CRD_FILE_NAME}`"
    )


def test_crd_is_a_valid_kubernetes_manifest() -> None:
    kubernetes_validate.validate(committed_crd(), KUBERNETES_VERSION, strict=True)


def test_crd_names_and_subresources() -> None:
    spec = committed_crd()["spec"]
    assert spec["group"] == "durable.dev"
    assert spec["names"]["kind"] == "DurableProducer"
    assert spec["names"]["plural"] == "durableproducers"
    assert spec["names"]["shortNames"] == ["dp"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Size"] == ".status.bufferSize"
    assert columns["Pods"] == ".status.attachedPods"
    assert columns["Backlog"] == ".status.backlogBytes"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_schema_is_structural() -> None:
    schema = committed_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in schema_nodes(schema):
        assert "type" in node, f"{path} has no type"
        leftovers = FORBIDDEN_KEYWORDS & node.keys()
        assert not leftovers, f"{path} has {leftovers}"
        assert node.get("default", ...) is not None, f"{path} has a null default"


def test_every_default_is_valid_for_its_own_field() -> None:
    """The API server rejects a CRD whose defaults fail their own schema."""
    schema = crd.resource_schema()
    checked = 0
    for path, node in schema_nodes(schema):
        if "default" in node:
            errors = list(
                jsonschema.Draft202012Validator(crd.strict_schema(node)).iter_errors(
                    node["default"]
                )
            )
            assert not errors, f"{path}: default {node['default']!r} is invalid: {errors}"
            checked += 1
    assert checked > 10, "expected defaults throughout the spec"


def test_schema_properties_match_model_fields() -> None:
    """Field by field: every model field (by its camelCase alias) is in the schema and back."""

    def compare(model_class: type[Any], node: dict[str, Any], path: str) -> None:
        aliases = {field.alias or name: field for name, field in model_class.model_fields.items()}
        assert set(node["properties"]) == set(aliases), path
        required = {alias for alias, field in aliases.items() if field.is_required()}
        assert set(node.get("required", [])) == required, path
        for alias, field in aliases.items():
            nested = _model_in(field.annotation)
            if nested is not None:
                child = node["properties"][alias]
                compare(nested, child.get("items", child), f"{path}.{alias}")

    schema = crd.resource_schema()
    compare(model.DurableProducerSpec, schema["properties"]["spec"], "spec")
    compare(model.DurableProducerStatus, schema["properties"]["status"], "status")


def _model_in(annotation: Any) -> type[Any] | None:
    """The pydantic model inside X, X | None or list[X], if any."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, model.CamelModel):
            return candidate
    return None


def apply_schema_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: absent fields get their default."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_schema_defaults(child, value[name])
    elif schema.get("type") == "array" and isinstance(value, list):
        return [apply_schema_defaults(schema["items"], item) for item in value]
    return value


@pytest.mark.parametrize(
    "spec",
    [
        {"kafka": {"bootstrapServers": ["k:9092"]}, "throughput": {"peakBytesPerSecond": 1}},
        {
            "kafka": {
                "bootstrapServers": ["k:9092"],
                "sasl": {"mechanism": "PLAIN", "secretName": "s"},
            },
            "throughput": {"peakBytesPerSecond": 1},
            "agent": {"resources": {"limits": {"cpu": "2"}}, "ports": {"kafka": 19092}},
            "fsync": {"policy": "always"},
        },
    ],
)
def test_crd_defaults_equal_model_defaults(spec: dict[str, Any]) -> None:
    """An object defaulted by the API server means the same as the raw one to the model."""
    spec_schema = crd.resource_schema()["properties"]["spec"]
    defaulted = apply_schema_defaults(spec_schema, copy.deepcopy(spec))
    assert defaulted != spec, "the API server would have filled in defaults"
    assert model.DurableProducerSpec.model_validate(defaulted) == (
        model.DurableProducerSpec.model_validate(spec)
    )


def test_module_entry_point_prints_the_crd() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "durable_producer.operator.crd"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert printed == CRD_PATH.read_text()


def test_every_cel_rule_compiles_with_a_cel_library() -> None:
    rules = CelRules(crd.resource_schema())  # compiles each rule and messageExpression

    assert {rule.path for rule in rules.rules} == {
        "<root>", ".spec", ".spec.agent.resources", ".spec.agent.ports"}


def test_storage_size_rule_never_refuses_a_size_the_agent_budget_accepts() -> None:
    """The CEL rule is a lower bound of volume_budget's answer, for every segment size."""
    spec_schema = crd.resource_schema()["properties"]["spec"]
    rules = CelRules(spec_schema)
    base = {"kafka": {"bootstrapServers": ["k:9092"]}, "throughput": {"peakBytesPerSecond": 1}}
    # Every size the schema allows from 1 to 16 MiB, then around each power of two up to 1024
    # (celpy takes ~20 ms per object).
    segments = sorted({*range(1, 17), *(2**k + d for k in range(4, 11) for d in (-1, 0, 1))}
                      - {1025})
    for segment in segments:
        smallest = minimum_volume_bytes(segment * MIB, DEFAULT_MAX_BATCH_BYTES) // MIB
        spec = apply_schema_defaults(spec_schema, {
            **copy.deepcopy(base), "storage": {"size": f"{smallest}Mi"},
            "agent": {"segmentSizeMib": segment}})
        assert rules.errors(spec, spec_schema) == [], segment
    # Tight where the margin is smallest (1 MiB segments): one MiB less is refused.
    smallest = minimum_volume_bytes(MIB, DEFAULT_MAX_BATCH_BYTES) // MIB
    too_small = apply_schema_defaults(spec_schema, {
        **copy.deepcopy(base), "storage": {"size": f"{smallest - 1}Mi"},
        "agent": {"segmentSizeMib": 1}})
    (error,) = rules.errors(too_small, spec_schema)
    margin = smallest - 2 * 1
    assert f"at least 2 x spec.agent.segmentSizeMib + {margin} MiB" in error
