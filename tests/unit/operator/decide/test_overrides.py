"""Per-pod agent settings by annotation (overrides.py): parsed, validated, applied."""

from __future__ import annotations

from typing import Any

import pytest

from durable_producer import contract
from durable_producer.buffer_agent.logging_setup import LOG_LEVELS
from durable_producer.operator.decide import overrides
from durable_producer.operator.model.model import DurableProducerSpec


def spec() -> DurableProducerSpec:
    return DurableProducerSpec.model_validate({
        "kafka": {"bootstrapServers": ["kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 2**20},
    })


def pod(annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "labels": {contract.PRODUCER_LABEL: "orders"}}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"containers": [{"name": "app"}]}}


def test_the_agent_log_levels_are_the_agents_own() -> None:
    assert contract.AGENT_LOG_LEVELS == LOG_LEVELS


def test_a_pod_without_annotations_changes_nothing() -> None:
    parsed = overrides.pod_overrides(pod())

    assert parsed == overrides.PodOverrides()
    assert isinstance(parsed, overrides.PodOverrides)
    assert overrides.effective_spec(spec(), parsed) is not None
    assert overrides.effective_spec(spec(), parsed) == spec()
    assert not overrides.opted_out(pod())


def test_every_override_is_read() -> None:
    parsed = overrides.pod_overrides(pod({
        contract.CPU_REQUEST_ANNOTATION: "250m",
        contract.CPU_LIMIT_ANNOTATION: "2",
        contract.MEMORY_REQUEST_ANNOTATION: "256Mi",
        contract.MEMORY_LIMIT_ANNOTATION: "1Gi",
        contract.FSYNC_POLICY_ANNOTATION: "never",
        contract.LOG_LEVEL_ANNOTATION: "warning",
        "unrelated.example/annotation": "kept out of it",
    }))

    assert parsed == overrides.PodOverrides(
        resources={"requests": {"cpu": "250m", "memory": "256Mi"},
                   "limits": {"cpu": "2", "memory": "1Gi"}},
        fsync_policy="never",
        log_level="WARNING",
    )


def test_overrides_replace_only_what_they_name() -> None:
    parsed = overrides.pod_overrides(pod({contract.CPU_REQUEST_ANNOTATION: "500m",
                                          contract.FSYNC_POLICY_ANNOTATION: "always"}))
    assert isinstance(parsed, overrides.PodOverrides)

    effective = overrides.effective_spec(spec(), parsed)

    assert isinstance(effective, DurableProducerSpec)
    resources = effective.agent.resources
    assert (resources.requests.cpu, resources.requests.memory) == ("500m", "128Mi")
    assert resources.limits.memory == "512Mi"
    assert effective.fsync.policy == "always"
    assert effective.fsync.interval_ms == spec().fsync.interval_ms
    assert effective.kafka == spec().kafka


@pytest.mark.parametrize(("annotations", "problem"), [
    ({contract.CPU_REQUEST_ANNOTATION: "lots"},
     f"annotation {contract.CPU_REQUEST_ANNOTATION}: 'lots' is not a Kubernetes quantity"),
    ({contract.MEMORY_LIMIT_ANNOTATION: "1 Gi"}, "is not a Kubernetes quantity"),
    ({contract.FSYNC_POLICY_ANNOTATION: "sometimes"},
     f"annotation {contract.FSYNC_POLICY_ANNOTATION}: 'sometimes' is not one of always,"
     " interval, never"),
    ({contract.LOG_LEVEL_ANNOTATION: "loud"}, "'loud' is not one of DEBUG, INFO, WARNING, ERROR"),
    ({contract.INJECT_ANNOTATION: "no"}, "'no' is not one of true, false"),
    ({f"{contract.POD_OVERRIDE_PREFIX}cpu": "1"},
     f"annotation {contract.POD_OVERRIDE_PREFIX}cpu is not known (known: "),
])  # fmt: skip
def test_bad_annotations_are_problems_named_one_by_one(
    annotations: dict[str, str], problem: str
) -> None:
    parsed = overrides.pod_overrides(pod(annotations))

    assert isinstance(parsed, list) and len(parsed) == 1
    assert problem in parsed[0]


def test_several_problems_are_all_reported() -> None:
    parsed = overrides.pod_overrides(pod({contract.CPU_LIMIT_ANNOTATION: "x",
                                          contract.FSYNC_POLICY_ANNOTATION: "y"}))

    assert isinstance(parsed, list) and len(parsed) == 2


@pytest.mark.parametrize(("annotations", "message"), [
    ({contract.MEMORY_LIMIT_ANNOTATION: "100Mi"},
     "the agent's memory limit 100Mi is below its request 128Mi"),
    ({contract.CPU_REQUEST_ANNOTATION: "600m", contract.CPU_LIMIT_ANNOTATION: "500m"},
     "the agent's cpu limit 500m is below its request 600m"),
])  # fmt: skip
def test_a_limit_below_its_request_cannot_be_applied(
    annotations: dict[str, str], message: str
) -> None:
    parsed = overrides.pod_overrides(pod(annotations))
    assert isinstance(parsed, overrides.PodOverrides)

    effective = overrides.effective_spec(spec(), parsed)

    assert isinstance(effective, str)
    assert message in effective


@pytest.mark.parametrize(("value", "out"), [("false", True), ("true", False), ("False", False)])
def test_only_exactly_false_opts_out(value: str, out: bool) -> None:
    assert overrides.opted_out(pod({contract.INJECT_ANNOTATION: value})) is out
