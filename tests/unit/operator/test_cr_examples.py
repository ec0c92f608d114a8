"""Good and bad DurableProducers: the model and the CRD schema accept and reject the same ones.

The CRD is applied as the API server would: defaults, the OpenAPI schema, then its CEL rules
evaluated with a CEL library (tests/support/crd_validation.py). Also every DurableProducer
shown in examples/ and docs/ is checked against it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from durable_producer.operator import crd
from durable_producer.operator.decide import reconcile
from durable_producer.operator.model import model
from support.crd_validation import ApiServerValidation

REPOSITORY = Path(__file__).resolve().parents[3]
# The OpenAPI schema alone (what jsonschema can check) ...
VALIDATOR = jsonschema.Draft202012Validator(crd.strict_schema(crd.resource_schema()))
# ... and everything the API server does: defaults, the schema, the CEL rules.
API_SERVER = ApiServerValidation(crd.resource_schema(), crd.strict_schema(crd.resource_schema()))
MINIMAL_SPEC: dict[str, Any] = {
    "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
    "throughput": {"peakBytesPerSecond": 1048576},
}
REMOVE = object()


def manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {"name": "example", "namespace": "default"},
        "spec": spec,
    }


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """MINIMAL_SPEC with dotted paths set (or removed with REMOVE)."""
    spec = copy.deepcopy(MINIMAL_SPEC)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        if value is REMOVE:
            del node[leaf]
        else:
            node[leaf] = value
    return spec


def openapi_errors(obj: dict[str, Any]) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(obj)]


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Why the API server would refuse the object (OpenAPI schema and CEL rules)."""
    return API_SERVER.errors(obj)


def model_error(spec: dict[str, Any]) -> str | None:
    """The operator's InvalidSpec message: the model's checks, then the agent's space budget."""
    try:
        model.DurableProducerSpec.model_validate(spec)
    except ValidationError as error:
        return reconcile.describe_validation_error(error)
    parsed = reconcile.parse_spec(spec)
    return parsed if isinstance(parsed, str) else None


GOOD_SPECS: dict[str, dict[str, Any]] = {
    "minimal": MINIMAL_SPEC,
    "tls-ca-only": with_changes({"kafka.tls": {"caSecretRef": {"name": "ca", "key": "ca.crt"}}}),
    "sasl-default-keys": with_changes(
        {"kafka.sasl": {"mechanism": "PLAIN", "secretName": "kafka-credentials"}}
    ),
    "ipv6-bootstrap": with_changes({"kafka.bootstrapServers": ["[fd00::1]:9092", "10.0.0.7:9093"]}),
    "size-override-decimal": with_changes({"storage.size": "10G"}),
    "fsync-never": with_changes({"fsync": {"policy": "never"}}),
    "lower-bounds": with_changes({"outageSeconds": 1, "checkpointIntervalMs": 100}),
    "block-when-full": with_changes({"fullDisk": {"policy": "block", "blockTimeoutMs": 0}}),
    "no-spark-templates": with_changes({"spark": {"executorTemplate": False}}),
    "small-but-working-size": with_changes({"storage.size": "600Mi"}),
    "small-segments-small-size": with_changes({"storage.size": "200Mi",
                                               "agent.segmentSizeMib": 8}),
    "highest-port": with_changes({"kafka.bootstrapServers": ["kafka:65535", "kafka:1"]}),
    "limits-equal-requests": with_changes(
        {"agent.resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                             "limits": {"cpu": "0.5", "memory": "1Gi"}}}),
    "image-with-digest": with_changes(
        {"agent.image": "registry.example:5000/team/durable-agent:1.0@sha256:abc123"}),
}


@dataclass(frozen=True)
class BadSpec:
    spec: dict[str, Any]
    model_says: str  # expected in the operator's InvalidSpec message
    schema_says: str  # expected in the jsonschema error
    only_cel_rejects: bool = field(default=False)  # a CEL rule of the CRD, not the OpenAPI part


BAD_SPECS: dict[str, BadSpec] = {
    "kafka-missing": BadSpec(
        with_changes({"kafka": REMOVE}), "spec.kafka is required", "'kafka' is a required property"
    ),
    "no-bootstrap-servers": BadSpec(
        with_changes({"kafka.bootstrapServers": []}),
        "spec.kafka.bootstrapServers: List should have at least 1 item",
        "[] should be non-empty",
    ),
    "bootstrap-without-port": BadSpec(
        with_changes({"kafka.bootstrapServers": ["kafka"]}),
        "spec.kafka.bootstrapServers[0] must be host:port",
        "'kafka' does not match",
    ),
    "zero-throughput": BadSpec(
        with_changes({"throughput.peakBytesPerSecond": 0}),
        "spec.throughput.peakBytesPerSecond: Input should be greater than or equal to 1",
        "0 is less than the minimum of 1",
    ),
    "throughput-as-string": BadSpec(
        with_changes({"throughput.peakBytesPerSecond": "1048576"}),
        "spec.throughput.peakBytesPerSecond: Input should be a valid integer",
        "'1048576' is not of type 'integer'",
    ),
    "outage-over-30-days": BadSpec(
        with_changes({"outageSeconds": 30 * 24 * 3600 + 1}),
        "spec.outageSeconds: Input should be less than or equal to 2592000",
        "2592001 is greater than the maximum of 2592000",
    ),
    "unknown-fsync-policy": BadSpec(
        with_changes({"fsync.policy": "sometimes"}),
        "spec.fsync.policy: Input should be 'always', 'interval' or 'never'",
        "'sometimes' is not one of ['always', 'interval', 'never']",
    ),
    "unknown-full-disk-policy": BadSpec(
        with_changes({"fullDisk.policy": "drop"}),
        "spec.fullDisk.policy: Input should be 'reject' or 'block'",
        "'drop' is not one of ['reject', 'block']",
    ),
    "misspelt-field": BadSpec(
        with_changes({"outageSecs": 60}),
        "spec.outageSecs is not a known field: remove it or fix its spelling",
        "Additional properties are not allowed ('outageSecs' was unexpected)",
    ),
    "inline-sasl-password": BadSpec(
        with_changes(
            {"kafka.sasl": {"mechanism": "PLAIN", "secretName": "creds", "password": "hunter2"}}
        ),
        "spec.kafka.sasl.password is not a known field",
        "Additional properties are not allowed ('password' was unexpected)",
    ),
    "unsupported-sasl-mechanism": BadSpec(
        with_changes({"kafka.sasl": {"mechanism": "GSSAPI", "secretName": "creds"}}),
        "spec.kafka.sasl.mechanism: Input should be 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'",
        "'GSSAPI' is not one of",
    ),
    "secret-name-not-dns": BadSpec(
        with_changes({"kafka.sasl": {"mechanism": "PLAIN", "secretName": "Kafka_Creds"}}),
        "spec.kafka.sasl.secretName must be a lowercase DNS name",
        "'Kafka_Creds' does not match",
    ),
    "size-not-a-quantity": BadSpec(
        with_changes({"storage.size": "lots"}),
        "spec.storage.size must be a Kubernetes quantity",
        "'lots' does not match",
    ),
    "privileged-port": BadSpec(
        with_changes({"agent.ports": {"kafka": 80}}),
        "spec.agent.ports.kafka: Input should be greater than or equal to 1024",
        "80 is less than the minimum of 1024",
    ),
    "same-port-twice": BadSpec(
        with_changes({"agent.ports": {"kafka": 9092, "metrics": 9092}}),
        "spec.agent.ports: kafka and metrics ports must differ",
        ".spec.agent.ports: Invalid value: kafka and metrics ports must differ",
        only_cel_rejects=True,
    ),
    # Defect: a small storage.size gave a Ready producer whose agents crash-loop.
    "zero-size": BadSpec(
        with_changes({"storage.size": "0"}),
        "spec.storage.size 0 cannot hold the agent's WAL",
        ".spec.storage.size: Invalid value: spec.storage.size 0 is too small: it must be at least"
        " 2 x spec.agent.segmentSizeMib + 77 MiB (205Mi with the default 64 MiB segments)",
        only_cel_rejects=True,
    ),
    "tiny-size": BadSpec(
        with_changes({"storage.size": "5Mi"}),
        "spec.storage.size 5Mi cannot hold the agent's WAL",
        "spec.storage.size 5Mi is too small",
        only_cel_rejects=True,
    ),
    "size-below-two-big-segments": BadSpec(
        with_changes({"storage.size": "1Gi", "agent.segmentSizeMib": 1024}),
        "spec.storage.size 1Gi cannot hold the agent's WAL",
        "spec.storage.size 1Gi is too small: it must be at least 2 x spec.agent.segmentSizeMib",
        only_cel_rejects=True,
    ),
    # Defect: the CRD accepted port 0 / 99999, a limit below its request, an image with spaces.
    "bootstrap-port-zero": BadSpec(
        with_changes({"kafka.bootstrapServers": ["kafka:0"]}),
        "spec.kafka.bootstrapServers[0] must be host:port (port 1 to 65535)",
        "'kafka:0' does not match",
    ),
    "bootstrap-port-too-high": BadSpec(
        with_changes({"kafka.bootstrapServers": ["kafka:9092", "kafka:99999"]}),
        "spec.kafka.bootstrapServers[1] must be host:port (port 1 to 65535)",
        "'kafka:99999' does not match",
    ),
    "memory-limit-below-request": BadSpec(
        with_changes({"agent.resources": {"requests": {"memory": "1Gi"},
                                          "limits": {"memory": "256Mi"}}}),
        "spec.agent.resources: limits.memory must be at least requests.memory (limit 256Mi,"
        " request 1Gi",
        ".spec.agent.resources.limits.memory: Invalid value: limits.memory 256Mi is less than"
        " requests.memory 1Gi",
        only_cel_rejects=True,
    ),
    "memory-limit-below-default-request": BadSpec(
        with_changes({"agent.resources": {"limits": {"memory": "64Mi"}}}),
        "limits.memory must be at least requests.memory (limit 64Mi, request 128Mi",
        "limits.memory 64Mi is less than requests.memory 128Mi",
        only_cel_rejects=True,
    ),
    "cpu-limit-below-request": BadSpec(
        with_changes({"agent.resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}}),
        "limits.cpu must be at least requests.cpu (limit 500m, request 2",
        "limits.cpu 500m is less than requests.cpu 2",
        only_cel_rejects=True,
    ),
    "image-with-spaces": BadSpec(
        with_changes({"agent.image": "durable-producer/agent 0.1.0"}),
        "spec.agent.image must be an image reference such as registry.example/durable-agent"
        ":0.1.0 (no spaces)",
        "'durable-producer/agent 0.1.0' does not match",
    ),
}


@pytest.mark.parametrize("name", sorted(GOOD_SPECS))
def test_good_spec_accepted_by_model_and_schema(name: str) -> None:
    spec = GOOD_SPECS[name]
    assert schema_errors(manifest(spec)) == []
    assert model_error(spec) is None


@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_bad_spec_rejected_by_model_and_schema_with_expected_messages(name: str) -> None:
    bad = BAD_SPECS[name]
    message = model_error(bad.spec)
    assert message is not None and bad.model_says in message, message
    errors = schema_errors(manifest(bad.spec))
    assert any(bad.schema_says in error for error in errors), errors
    if bad.only_cel_rejects:
        # The OpenAPI part cannot express it: without the CEL rule it would be stored.
        assert openapi_errors(manifest(bad.spec)) == []


def test_cel_rules_mirror_model_only_checks() -> None:
    """Checks jsonschema cannot express are carried as CEL rules with the model's message."""
    ports = crd.resource_schema()["properties"]["spec"]["properties"]["agent"]["properties"][
        "ports"
    ]
    (rule,) = ports["x-kubernetes-validations"]
    assert rule == {"rule": "self.kafka != self.metrics", "message": model.PORTS_DIFFER_MESSAGE}
    assert model.PORTS_DIFFER_MESSAGE in BAD_SPECS["same-port-twice"].model_says
    for resource in ("cpu", "memory"):
        message = model.limit_below_request_message(resource)
        assert any(message in bad.model_says for bad in BAD_SPECS.values())
    rules = {r.rule for r in API_SERVER.cel.rules}
    assert len(rules) == 5, rules  # name length, ports, cpu and memory limits, storage size


def test_a_size_the_cel_rule_lets_through_is_still_refused_by_the_operator() -> None:
    """The CEL rule is a lower bound of the agent's budget; the gap is InvalidSpec."""
    spec = with_changes({"storage.size": "220Mi"})  # 64 MiB segments need a little more

    assert schema_errors(manifest(spec)) == []
    message = model_error(spec)
    assert message is not None and "spec.storage.size 220Mi cannot hold" in message


def test_missing_spec_rejected() -> None:
    obj = manifest(MINIMAL_SPEC)
    del obj["spec"]
    assert "'spec' is a required property" in schema_errors(obj)
    assert reconcile.parse_spec(None) == (
        "invalid spec: spec is required: add spec.kafka and spec.throughput."
    )


def documented_durable_producers() -> list[tuple[str, dict[str, Any]]]:
    """Every DurableProducer in examples/*.yaml and in ```yaml blocks of docs/*.md, README.md."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted((REPOSITORY / "examples").glob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document and document.get("kind") == model.KIND:
                found.append((f"{path.relative_to(REPOSITORY)}#{index}", document))
    markdown = [*sorted((REPOSITORY / "docs").glob("*.md")), REPOSITORY / "README.md"]
    for path in [path for path in markdown if path.exists()]:
        blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.DOTALL)
        for index, block in enumerate(blocks):
            for document in yaml.safe_load_all(block):
                if isinstance(document, dict) and document.get("kind") == model.KIND:
                    found.append((f"{path.relative_to(REPOSITORY)}#{index}", document))
    return found


DOCUMENTED = documented_durable_producers()


def test_examples_exist_in_examples_and_docs() -> None:
    sources = {name.split("#")[0] for name, _ in DOCUMENTED}
    assert "examples/durableproducer-minimal.yaml" in sources
    assert "docs/operator.md" in sources


@pytest.mark.parametrize(("source", "document"), DOCUMENTED, ids=[n for n, _ in DOCUMENTED])
def test_documented_example_is_valid(source: str, document: dict[str, Any]) -> None:
    assert schema_errors(document) == [], source
    assert model_error(document["spec"]) is None, source
