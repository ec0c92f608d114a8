"""The pydantic model of DurableProducer: names, defaults, secrets only by reference."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from durable_producer.operator.decide.reconcile import desired_status, parse_spec
from durable_producer.operator.model import model

MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrapServers": ["kafka:9092"]},
    "throughput": {"peakBytesPerSecond": 1000},
}


def test_defaults_of_a_minimal_spec() -> None:
    spec = model.DurableProducerSpec.model_validate(MINIMAL)
    assert spec.outage_seconds == 3600
    assert spec.checkpoint_interval_ms == 5000
    assert spec.fsync.policy == "interval" and spec.fsync.interval_ms == 100
    assert spec.full_disk.policy == "reject" and spec.full_disk.block_timeout_ms == 5000
    assert spec.storage.size is None and spec.storage.headroom_percent == 25
    assert spec.agent.ports.kafka == 9092 and spec.agent.ports.metrics == 9644
    assert spec.agent.resources.requests.memory == "128Mi"
    assert spec.spark.executor_template and not spec.spark.driver_template
    assert spec.spark.container_name == "spark-kubernetes-executor"


def test_yaml_names_are_camel_case_and_round_trip() -> None:
    spec = model.DurableProducerSpec.model_validate(
        {**MINIMAL, "fullDisk": {"policy": "block", "blockTimeoutMs": 250}}
    )
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["fullDisk"] == {"policy": "block", "blockTimeoutMs": 250}
    assert "checkpointIntervalMs" in dumped and "checkpoint_interval_ms" not in dumped
    assert model.DurableProducerSpec.model_validate(dumped) == spec


@pytest.mark.parametrize(
    "section",
    [
        {"tls": {"caCertificate": "-----BEGIN CERTIFICATE-----"}},
        {"tls": {"clientKey": "-----BEGIN PRIVATE KEY-----"}},
        {"sasl": {"mechanism": "PLAIN", "secretName": "creds", "username": "u", "password": "p"}},
    ],
)
def test_secrets_cannot_be_given_inline(section: dict[str, Any]) -> None:
    spec = {**MINIMAL, "kafka": {**MINIMAL["kafka"], **section}}
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.DurableProducerSpec.model_validate(spec)


def test_no_field_of_the_kafka_section_can_hold_a_secret_value() -> None:
    """Every string field under spec.kafka is a host, a name or a key, never secret material."""
    allowed = {"bootstrapServers", "name", "key", "clientCertificateSecretName", "mechanism",
               "secretName", "usernameKey", "passwordKey"}  # fmt: skip

    def string_fields(model_class: type[model.CamelModel]) -> set[str]:
        found: set[str] = set()
        for name, field in model_class.model_fields.items():
            nested = [a for a in getattr(field.annotation, "__args__", ()) if isinstance(a, type)]
            for candidate in [field.annotation, *nested]:
                if isinstance(candidate, type) and issubclass(candidate, model.CamelModel):
                    found |= string_fields(candidate)
                    break
            else:
                found.add(field.alias or name)
        return found

    assert string_fields(model.KafkaSettings) <= allowed


def test_status_model_accepts_what_reconcile_writes() -> None:
    status = desired_status(MINIMAL, {}, 1, datetime(2026, 1, 1, tzinfo=UTC)).status
    parsed = model.DurableProducerStatus.model_validate(status)
    assert parsed.buffer_size == "1Gi"
    assert [c.type for c in parsed.conditions] == ["Ready", "Degraded"]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"spark": {"containerName": "my.spark"}}, "a container name"),
        ({"spark": {"containerName": "x" * 64}}, "at most 63 characters"),
    ],
)
def test_what_a_pod_cannot_take_is_refused(
    section: dict[str, Any], message: str
) -> None:
    """It was accepted: a dotted container name made every executor pod Spark built from the
    template invalid."""
    refusal = parse_spec({**MINIMAL, **section})
    assert isinstance(refusal, str) and message in refusal, refusal
