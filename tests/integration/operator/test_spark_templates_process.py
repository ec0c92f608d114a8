"""The real operator (`kopf run`) renders each DurableProducer's Spark pod templates ConfigMap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from durable_producer import contract
from durable_producer.operator import api_access, pod_mutation, spark_actions
from durable_producer.operator.model import API_VERSION, KIND
from integration.operator.operator_harness import (
    NAMESPACE,
    KubernetesApi,
    OperatorProcess,
)
from integration.operator.test_webhook_harness import api_call
from support.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIGMAP = "orders-spark-templates"
CONFIGMAP_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP}"


def durable_producer(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 2**20},
        "outageSeconds": 600,
    }
    spec.update(spec_overrides)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "orders"}, "spec": spec}


def read_configmap(kubernetes_api: KubernetesApi) -> dict[str, Any] | None:
    status, found = api_call(kubernetes_api, "GET", CONFIGMAP_PATH)
    return found if status == 200 else None


def recorded_configmap(kubernetes_api: KubernetesApi) -> str | None:
    found = kubernetes_api.get("orders") or {}
    return (found.get("status") or {}).get(spark_actions.STATUS_FIELD)


def executor_template(configmap: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = yaml.safe_load(
        configmap["data"][contract.EXECUTOR_TEMPLATE_KEY]
    )
    return template


def executor_env(configmap: dict[str, Any]) -> dict[str, str]:
    (container,) = executor_template(configmap)["spec"]["containers"]
    return {variable["name"]: variable["value"] for variable in container["env"]}


def assert_configmap_requests_declared(kubernetes_api: KubernetesApi) -> None:
    """What the operator did to ConfigMaps is what the chart grants (SPARK_TEMPLATES_API_ACCESS)."""
    declared = {
        verb
        for _, resource, verbs in api_access.SPARK_TEMPLATES_API_ACCESS
        if resource == "configmaps"
        for verb in verbs
    }
    used = {
        request.verb
        for request in kubernetes_api.requests()
        if request.plural == "configmaps"
        and request.user_agent == api_access.SPARK_TEMPLATES_USER_AGENT
    }
    assert used, "the operator never touched a ConfigMap"
    assert used <= declared, f"undeclared ConfigMap access: {sorted(used - declared)}"


def test_templates_are_rendered_recorded_and_rerendered_on_spec_changes(
    kubernetes_api: KubernetesApi, operator_process: OperatorProcess
) -> None:
    created = kubernetes_api.create(durable_producer())

    wait_for(
        lambda: recorded_configmap(kubernetes_api) == CONFIGMAP,
        what="status.sparkTemplatesConfigMap",
    )
    configmap = read_configmap(kubernetes_api)
    assert configmap is not None
    assert list(configmap["data"]) == [contract.EXECUTOR_TEMPLATE_KEY]
    template = executor_template(configmap)
    assert template["metadata"]["labels"] == {contract.PRODUCER_LABEL: "orders"}
    assert template["spec"]["terminationGracePeriodSeconds"] == (pod_mutation.MINIMUM_GRACE_SECONDS)
    assert executor_env(configmap)["DURABLE_PRODUCER_BOOTSTRAP"] == "127.0.0.1:9092"
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == (KIND, created["metadata"]["uid"])

    kubernetes_api.patch_spec(
        "orders",
        {"agent": {"ports": {"kafka": 19092}}, "spark": {"driverTemplate": True}},
    )

    rerendered = wait_for(
        lambda: (
            (cm := read_configmap(kubernetes_api))
            and contract.DRIVER_TEMPLATE_KEY in cm["data"]
            and cm
        ),
        what="the driver template after the spec change",
    )
    assert executor_env(rerendered) == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19092",
        "DURABLE_PRODUCER_BOOTSTRAP": "127.0.0.1:19092",
    }
    driver = yaml.safe_load(rerendered["data"][contract.DRIVER_TEMPLATE_KEY])
    assert driver["spec"]["containers"][0]["name"] == "spark-kubernetes-driver"
    assert recorded_configmap(kubernetes_api) == CONFIGMAP

    kubernetes_api.patch_spec(
        "orders", {"spark": {"executorTemplate": False, "driverTemplate": False}}
    )

    wait_for(
        lambda: (
            read_configmap(kubernetes_api) is None and recorded_configmap(kubernetes_api) is None
        ),
        what="the ConfigMap and its status field to go when no template is wanted",
    )
    assert_configmap_requests_declared(kubernetes_api)


def test_a_restarted_operator_restores_a_deleted_configmap(
    kubernetes_api: KubernetesApi, start_operator: Callable[[], OperatorProcess]
) -> None:
    kubernetes_api.create(durable_producer())
    first = start_operator()
    wait_for(lambda: read_configmap(kubernetes_api), what="the ConfigMap")
    first.stop()
    status, answer = api_call(kubernetes_api, "DELETE", CONFIGMAP_PATH)
    assert status == 200, answer
    assert read_configmap(kubernetes_api) is None

    start_operator()

    restored = wait_for(lambda: read_configmap(kubernetes_api), what="the restored ConfigMap")
    assert executor_template(restored)["metadata"]["labels"][contract.PRODUCER_LABEL] == (
        "orders"
    )
    assert recorded_configmap(kubernetes_api) == CONFIGMAP
