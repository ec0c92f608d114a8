"""The real operator (the chart's `kopf run`, on the real API server) renders each
DurableProducer's Spark pod templates ConfigMap; the garbage collector deletes it with its owner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from durable_producer import contract
from durable_producer.operator.act import api_access, spark_actions
from durable_producer.operator.decide import agent_container
from durable_producer.operator.model.model import API_VERSION, KIND
from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for

pytestmark = pytest.mark.integration

CONFIGMAP = "orders-spark-templates"


def durable_producer(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 2**20},
        "outageSeconds": 600,
    }
    spec.update(spec_overrides)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "orders"}, "spec": spec}


def read_configmap(kube_api: KubeApi) -> dict[str, Any] | None:
    status, found = kube_api.call("GET", f"{kube_api.configmaps_path}/{CONFIGMAP}")
    return found if status == 200 else None


def recorded_configmap(kube_api: KubeApi) -> str | None:
    found = kube_api.get("orders") or {}
    return (found.get("status") or {}).get(spark_actions.STATUS_FIELD)


def executor_template(configmap: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = yaml.safe_load(
        configmap["data"][contract.EXECUTOR_TEMPLATE_KEY]
    )
    return template


def executor_env(configmap: dict[str, Any]) -> dict[str, str]:
    (container,) = executor_template(configmap)["spec"]["containers"]
    return {variable["name"]: variable["value"] for variable in container["env"]}


def assert_configmap_requests_declared(kube_api: KubeApi) -> None:
    """What the operator did to ConfigMaps is what the chart grants (SPARK_TEMPLATES_API_ACCESS)."""
    declared = {
        verb
        for _, resource, verbs in api_access.SPARK_TEMPLATES_API_ACCESS
        if resource == "configmaps"
        for verb in verbs
    }
    used = {
        request.verb
        for request in kube_api.requests()
        if request.resource == "configmaps"
        and request.user_agent == api_access.SPARK_TEMPLATES_USER_AGENT
    }
    assert used, "the operator never touched a ConfigMap"
    assert used <= declared, f"undeclared ConfigMap access: {sorted(used - declared)}"


def test_templates_are_rendered_recorded_and_rerendered_on_spec_changes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    start_chart_operator()
    created = kube_api.create(durable_producer())

    wait_for(
        lambda: recorded_configmap(kube_api) == CONFIGMAP,
        timeout=60, what="status.sparkTemplatesConfigMap",
    )
    configmap = read_configmap(kube_api)
    assert configmap is not None
    assert list(configmap["data"]) == [contract.EXECUTOR_TEMPLATE_KEY]
    template = executor_template(configmap)
    assert template["metadata"]["labels"] == {contract.PRODUCER_LABEL: "orders"}
    assert template["spec"]["terminationGracePeriodSeconds"] == (
        agent_container.MINIMUM_GRACE_SECONDS)
    assert executor_env(configmap)["DURABLE_PRODUCER_BOOTSTRAP"] == "127.0.0.1:9092"
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == (KIND, created["metadata"]["uid"])

    kube_api.patch_spec(
        "orders",
        {"agent": {"ports": {"kafka": 19092}}, "spark": {"driverTemplate": True}},
    )

    rerendered = wait_for(
        lambda: (
            (cm := read_configmap(kube_api))
            and contract.DRIVER_TEMPLATE_KEY in cm["data"]
            and cm
        ),
        timeout=60, what="the driver template after the spec change",
    )
    assert executor_env(rerendered) == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19092",
        "DURABLE_PRODUCER_BOOTSTRAP": "127.0.0.1:19092",
    }
    driver = yaml.safe_load(rerendered["data"][contract.DRIVER_TEMPLATE_KEY])
    assert driver["spec"]["containers"][0]["name"] == "spark-kubernetes-driver"
    assert recorded_configmap(kube_api) == CONFIGMAP

    kube_api.patch_spec(
        "orders", {"spark": {"executorTemplate": False, "driverTemplate": False}}
    )

    wait_for(
        lambda: (
            read_configmap(kube_api) is None and recorded_configmap(kube_api) is None
        ),
        timeout=60,
        what="the ConfigMap and its status field to go when no template is wanted",
    )
    assert_configmap_requests_declared(kube_api)


def test_a_restarted_operator_restores_a_deleted_configmap(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    first = start_chart_operator()
    wait_for(lambda: read_configmap(kube_api), timeout=60, what="the ConfigMap")
    first.process.stop()
    status, answer = kube_api.call("DELETE", f"{kube_api.configmaps_path}/{CONFIGMAP}")
    assert status == 200, answer
    assert read_configmap(kube_api) is None

    start_chart_operator()

    restored = wait_for(lambda: read_configmap(kube_api), timeout=60,
                        what="the restored ConfigMap")
    assert executor_template(restored)["metadata"]["labels"][contract.PRODUCER_LABEL] == (
        "orders"
    )
    assert recorded_configmap(kube_api) == CONFIGMAP


def test_the_garbage_collector_deletes_the_configmap_with_its_producer(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """The ConfigMap's ownerReference: the real garbage collector removes it (background)."""
    start_chart_operator()
    kube_api.create(durable_producer())
    wait_for(lambda: read_configmap(kube_api), timeout=60, what="the ConfigMap")

    kube_api.delete("orders", propagation="Background")

    wait_for(lambda: kube_api.get("orders") is None, timeout=60, what="the producer to go")
    # The real garbage collector took 41 s here on a quiet machine after the producer was gone
    # (0.06 s): its graph learns of the owner's deletion on its own schedule. With 60 s this
    # wait failed under load (a fresh clone's make test); the operator plays no part in it.
    wait_for(lambda: read_configmap(kube_api) is None, timeout=150,
             what="the garbage collector to delete the ConfigMap")
