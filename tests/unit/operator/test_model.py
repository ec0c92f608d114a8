"""The pydantic model of DurableProducer: names, defaults, secrets only by reference."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from durable_producer.operator import handlers, model
from durable_producer.operator.reconcile import desired_status
from durable_producer.operator.settings import WATCH_SERVER_TIMEOUT_ENV, OperatorTuning

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


def test_agent_image_falls_back_to_the_operator_environment() -> None:
    agent = model.AgentSettings()
    assert agent.effective_image({}) == model.DEFAULT_AGENT_IMAGE
    assert agent.effective_image({model.AGENT_IMAGE_ENV: "reg/agent:1.2"}) == "reg/agent:1.2"
    pinned = model.AgentSettings(image="mine/agent:9", image_pull_policy="Always")
    assert pinned.effective_image({model.AGENT_IMAGE_ENV: "reg/agent:1.2"}) == "mine/agent:9"
    assert pinned.effective_pull_policy({model.AGENT_IMAGE_PULL_POLICY_ENV: "Never"}) == "Always"
    assert agent.effective_pull_policy({model.AGENT_IMAGE_PULL_POLICY_ENV: "Never"}) == "Never"
    assert agent.effective_pull_policy({model.AGENT_IMAGE_PULL_POLICY_ENV: "bogus"}) == (
        "IfNotPresent"
    )


def test_status_model_accepts_what_reconcile_writes() -> None:
    status = desired_status(MINIMAL, {}, 1, datetime(2026, 1, 1, tzinfo=UTC)).status
    parsed = model.DurableProducerStatus.model_validate(status)
    assert parsed.buffer_size == "1Gi"
    assert [c.type for c in parsed.conditions] == ["Ready", "Degraded"]


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 300), ("120", 120), ("0", 300), ("-3", 300), ("soon", 300)]
)
def test_watch_timeouts_from_environment(raw: str | None, expected: int) -> None:
    environ = {} if raw is None else {WATCH_SERVER_TIMEOUT_ENV: raw}
    tuning = OperatorTuning.from_environ(environ)
    assert tuning.watch_server_timeout == expected
    assert tuning.watch_client_timeout > tuning.watch_server_timeout


def test_api_access_list_is_well_formed_and_least_privilege() -> None:
    known_verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    seen: set[tuple[str, str]] = set()
    for group, resource, verbs in handlers.KUBERNETES_API_ACCESS:
        assert (group, resource) not in seen, f"{group}/{resource} listed twice"
        seen.add((group, resource))
        assert verbs and set(verbs) <= known_verbs and "*" not in verbs
        assert len(set(verbs)) == len(verbs)
    assert (model.GROUP, model.PLURAL) in seen
    assert (model.GROUP, f"{model.PLURAL}/status") in seen
    # The operator never deletes or rewrites whole DurableProducers.
    dp_verbs = dict(((g, r), v) for g, r, v in handlers.KUBERNETES_API_ACCESS)
    assert not {"delete", "update", "create"} & set(dp_verbs[(model.GROUP, model.PLURAL)])


def test_finalizer_is_ours() -> None:
    assert handlers.FINALIZER == "durable.dev/finalizer"


def test_operator_guide_lists_exactly_the_declared_api_access() -> None:
    guide = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()
    section = guide[guide.index("## Kubernetes API access") :]
    rows = re.findall(r"^\| `([^`]*)`[^|]*\| `([^`]+)` \| ([a-z, ]+) \|$", section, re.MULTILINE)
    documented = {(group.strip('"'), resource, tuple(v.strip() for v in verbs.split(",")))
                  for group, resource, verbs in rows}  # fmt: skip
    assert documented == set(handlers.KUBERNETES_API_ACCESS)
