"""Spark pod templates: valid Pods with label, env and grace period; idempotent ConfigMap plans."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from durable_producer import contract
from durable_producer.operator.decide import agent_container, pod_mutation, spark_templates
from durable_producer.operator.decide.spark_templates import TemplatesActionKind
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import API_VERSION, KIND, DurableProducerSpec
from durable_producer.spark_integration.conf import (
    DRIVER_TEMPLATE_KEY,
    EXECUTOR_CONTAINER_NAME,
    EXECUTOR_GRACE_PERIOD,
    EXECUTOR_TEMPLATE_KEY,
    PodTemplates,
    spark_conf,
    write_rendered_templates,
)

# The oldest Kubernetes the chart supports and the newest kubectl we ship.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
UID = "6c1f9a52-0000-4000-8000-000000000001"


def make_spec(**overrides: Any) -> DurableProducerSpec:
    raw: dict[str, Any] = {
        "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 2**20},
    }
    raw.update(overrides)
    return DurableProducerSpec.model_validate(raw)


def producer(name: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": "data", "uid": UID},
    }


def stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap as the API server returns it: server fields and someone else's label."""
    result = copy.deepcopy(manifest)
    result["metadata"].update(
        uid="cm-uid", resourceVersion="42", creationTimestamp="2026-01-01T00:00:00Z"
    )
    result["metadata"]["labels"]["team"] = "data-eng"
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def templates(spec: DurableProducerSpec) -> dict[str, dict[str, Any]]:
    data = spark_templates.rendered_templates("orders", spec)
    return {key: yaml.safe_load(text) for key, text in data.items()}


def env_of(template: dict[str, Any]) -> dict[str, str]:
    (container,) = template["spec"]["containers"]
    return {variable["name"]: variable["value"] for variable in container["env"]}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_templates_and_configmap_are_valid_kubernetes_objects(version: str) -> None:
    spec = make_spec(spark={"driverTemplate": True})
    manifest = spark_templates.templates_configmap(producer(), spec)
    assert manifest is not None

    for template in templates(spec).values():
        kubernetes_validate.validate(template, version, strict=True)
    kubernetes_validate.validate(manifest, version, strict=True)


def test_the_validator_would_catch_a_broken_template() -> None:
    broken = templates(make_spec())[EXECUTOR_TEMPLATE_KEY]
    broken["spec"]["terminationGracePeriodSeconds"] = "a minute"

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_executor_template_carries_label_env_and_drain_grace_period() -> None:
    rendered = templates(make_spec())

    assert list(rendered) == [EXECUTOR_TEMPLATE_KEY]  # no driver template unless asked
    executor = rendered[EXECUTOR_TEMPLATE_KEY]
    assert executor["kind"] == "Pod"
    assert executor["metadata"]["labels"] == {contract.PRODUCER_LABEL: "orders"}
    assert executor["spec"]["containers"][0]["name"] == "spark-kubernetes-executor"
    assert env_of(executor) == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "DURABLE_PRODUCER_BOOTSTRAP": "127.0.0.1:9092",
    }
    grace = executor["spec"]["terminationGracePeriodSeconds"]
    assert grace == agent_container.MINIMUM_GRACE_SECONDS
    assert grace > agent_container.AGENT_DRAIN_TIMEOUT_SECONDS
    # The agent is not in the template: the webhook adds it from the current spec.
    assert "initContainers" not in executor["spec"]
    assert "volumes" not in executor["spec"]


def test_spec_settings_reach_the_templates() -> None:
    spec = make_spec(
        agent={"ports": {"kafka": 19092, "metrics": 19644}},
        spark={"containerName": "executor", "driverTemplate": True},
    )

    rendered = templates(spec)

    executor, driver = rendered[EXECUTOR_TEMPLATE_KEY], rendered[DRIVER_TEMPLATE_KEY]
    assert executor["spec"]["containers"][0]["name"] == "executor"
    assert driver["spec"]["containers"][0]["name"] == "spark-kubernetes-driver"
    for template in (executor, driver):
        assert set(env_of(template).values()) == {"127.0.0.1:19092"}
        assert template["metadata"]["labels"][contract.PRODUCER_LABEL] == "orders"


def test_webhook_leaves_the_template_grace_period_and_env_as_they_are() -> None:
    """The template already satisfies the webhook: one concept (the drain grace), one value."""
    spec = make_spec()
    pod = templates(spec)[EXECUTOR_TEMPLATE_KEY]
    pod["spec"]["containers"][0]["image"] = "spark:4.3"

    mutated = pod_mutation.mutated_pod(pod, "orders", spec, "orders-buffer-1", AgentImage())

    assert mutated["spec"]["terminationGracePeriodSeconds"] == agent_container.MINIMUM_GRACE_SECONDS
    assert mutated["spec"]["containers"][0]["env"] == pod["spec"]["containers"][0]["env"]
    assert pod_mutation.is_injected(mutated)


def test_spark_conf_helper_accepts_the_rendered_templates(tmp_path: Path) -> None:
    spec = make_spec(spark={"driverTemplate": True})
    files = write_rendered_templates(
        spark_templates.rendered_templates("orders", spec), tmp_path / "templates"
    )

    conf = spark_conf(files)

    assert isinstance(files, PodTemplates) and files.driver is not None
    assert conf[EXECUTOR_CONTAINER_NAME] == "spark-kubernetes-executor"
    assert conf[EXECUTOR_GRACE_PERIOD] == str(agent_container.MINIMUM_GRACE_SECONDS)
    assert conf["spark.kubernetes.executor.label.durable.dev/producer"] == "orders"


def test_configmap_is_named_for_the_conf_helper_and_owned_by_the_producer() -> None:
    manifest = spark_templates.templates_configmap(producer(), make_spec())

    assert manifest is not None
    assert manifest["metadata"]["name"] == "orders-spark-templates"
    assert manifest["metadata"]["namespace"] == "data"
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (KIND, "orders", UID)
    assert owner["controller"] is True
    assert manifest["metadata"]["labels"][spark_templates.TEMPLATES_FOR_LABEL] == "orders"


def test_rendering_is_deterministic() -> None:
    spec = make_spec(spark={"driverTemplate": True})

    first = spark_templates.templates_configmap(producer(), spec)
    second = spark_templates.templates_configmap(
        producer(), make_spec(spark={"driverTemplate": True})
    )

    assert first == second


def test_plan_creates_then_leaves_an_up_to_date_configmap_alone() -> None:
    spec = make_spec()

    created = spark_templates.plan_templates(producer(), spec, None)

    assert created.kind is TemplatesActionKind.CREATE
    assert created.body == spark_templates.templates_configmap(producer(), spec)
    assert created.body is not None
    again = spark_templates.plan_templates(producer(), spec, stored(created.body))
    assert again.kind is TemplatesActionKind.NOTHING
    assert again.body is None


def test_spec_change_patches_only_what_changed_and_then_converges() -> None:
    before = make_spec()
    existing = stored(spark_templates.templates_configmap(producer(), before) or {})
    after = make_spec(agent={"ports": {"kafka": 19092, "metrics": 9644}})

    action = spark_templates.plan_templates(producer(), after, existing)

    assert action.kind is TemplatesActionKind.PATCH
    assert action.body is not None
    assert set(action.body) == {"data"}  # labels and owner unchanged
    patched = merge_patch(existing, action.body)
    assert "127.0.0.1:19092" in patched["data"][EXECUTOR_TEMPLATE_KEY]
    assert patched["metadata"]["labels"]["team"] == "data-eng"  # others' labels kept
    assert spark_templates.plan_templates(producer(), after, patched).kind is (
        TemplatesActionKind.NOTHING
    )


def test_dropping_the_driver_template_removes_its_key() -> None:
    with_driver = make_spec(spark={"driverTemplate": True})
    existing = stored(spark_templates.templates_configmap(producer(), with_driver) or {})

    action = spark_templates.plan_templates(producer(), make_spec(), existing)

    assert action.kind is TemplatesActionKind.PATCH
    assert action.body == {"data": {DRIVER_TEMPLATE_KEY: None}}
    assert list(merge_patch(existing, action.body)["data"]) == [EXECUTOR_TEMPLATE_KEY]


def test_a_lost_owner_reference_or_label_is_restored() -> None:
    spec = make_spec()
    existing = stored(spark_templates.templates_configmap(producer(), spec) or {})
    del existing["metadata"]["ownerReferences"]
    del existing["metadata"]["labels"][spark_templates.TEMPLATES_FOR_LABEL]

    action = spark_templates.plan_templates(producer(), spec, existing)

    assert action.kind is TemplatesActionKind.PATCH
    assert action.body is not None and set(action.body) == {"metadata"}
    patched = merge_patch(existing, action.body)
    assert spark_templates.plan_templates(producer(), spec, patched).kind is (
        TemplatesActionKind.NOTHING
    )


def test_no_template_wanted_deletes_only_our_own_configmap() -> None:
    none_wanted = make_spec(spark={"executorTemplate": False, "driverTemplate": False})
    ours = stored(spark_templates.templates_configmap(producer(), make_spec()) or {})
    foreign = copy.deepcopy(ours)
    foreign["metadata"]["ownerReferences"] = []

    assert not spark_templates.wanted(none_wanted)
    assert spark_templates.templates_configmap(producer(), none_wanted) is None
    delete = spark_templates.plan_templates(producer(), none_wanted, ours)
    assert (delete.kind, delete.name) == (TemplatesActionKind.DELETE, "orders-spark-templates")
    assert spark_templates.plan_templates(producer(), none_wanted, foreign).kind is (
        TemplatesActionKind.NOTHING
    )
    assert spark_templates.plan_templates(producer(), none_wanted, None).kind is (
        TemplatesActionKind.NOTHING
    )


def test_a_name_too_long_for_the_configmap_is_refused_with_the_limit() -> None:
    longest = "p" * (253 - len("-spark-templates"))

    assert spark_templates.configmap_name(longest) == f"{longest}-spark-templates"
    with pytest.raises(ValueError, match=f"at most {len(longest)} characters"):
        spark_templates.configmap_name(longest + "p")
