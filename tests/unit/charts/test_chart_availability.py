"""The chart keeps the webhook served: replicas, rollout, disruption budget, readiness, peering.

Rendered by the real helm binary with default values unless a test says otherwise.
"""

from __future__ import annotations

from typing import Any

from durable_producer.operator import settings
from durable_producer.operator.act import api_access
from support.tools import objects_of_kind, render_chart, single_object

SELECTOR = {
    "app.kubernetes.io/name": "durable-producer",
    "app.kubernetes.io/instance": "dp",
    "app.kubernetes.io/component": "operator",
}


def deployment_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return single_object(objects, "Deployment")


def container_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = deployment_of(objects)["spec"]["template"]["spec"]["containers"]
    return container


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container_of(objects)["env"]}


def test_two_replicas_roll_without_ever_dropping_below_two(
    default_objects: list[dict[str, Any]],
) -> None:
    spec = deployment_of(default_objects)["spec"]

    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_a_disruption_budget_keeps_one_replica_through_node_drains(
    default_objects: list[dict[str, Any]],
) -> None:
    budget = single_object(default_objects, "PodDisruptionBudget")
    pod_labels = deployment_of(default_objects)["spec"]["template"]["metadata"]["labels"]

    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert SELECTOR.items() <= pod_labels.items()
    assert budget["metadata"]["namespace"] == "durable-system"


def test_a_single_replica_gets_no_budget_that_would_block_every_drain() -> None:
    objects = render_chart({"operator": {"replicas": 1}})

    assert deployment_of(objects)["spec"]["replicas"] == 1
    assert not objects_of_kind(objects, "PodDisruptionBudget")


def test_readiness_asks_the_operators_readyz_on_its_metrics_port(
    default_objects: list[dict[str, Any]],
) -> None:
    container = container_of(default_objects)
    probe = container["readinessProbe"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    serving = settings.ServingSettings.from_environ(env_of(default_objects))

    assert probe["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ports["metrics"] == serving.metrics_port == 8081
    assert serving.metrics_addr == ""  # every address of both families: pod IP probes work
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 15


def test_replicas_prefer_different_nodes(default_objects: list[dict[str, Any]]) -> None:
    affinity = deployment_of(default_objects)["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]

    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAntiAffinity"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": SELECTOR}


def test_own_affinity_rules_replace_the_default() -> None:
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    objects = render_chart({"operator": {"affinity": mine}})

    assert deployment_of(objects)["spec"]["template"]["spec"]["affinity"] == mine


def test_a_stopping_replica_keeps_answering_while_it_leaves_the_service(
    default_objects: list[dict[str, Any]],
) -> None:
    hook = container_of(default_objects)["lifecycle"]["preStop"]["exec"]["command"]
    grace = deployment_of(default_objects)["spec"]["template"]["spec"].get(
        "terminationGracePeriodSeconds", 30)

    assert hook == ["python", "-c", "import time; time.sleep(5)"]
    assert grace > 5
    assert "lifecycle" not in container_of(
        render_chart({"operator": {"preStopSleepSeconds": 0}}))


def test_replicas_share_the_handlers_through_the_charts_peering_object(
    default_objects: list[dict[str, Any]],
) -> None:
    command = container_of(default_objects)["command"]
    peering = single_object(default_objects, "ClusterKopfPeering")
    env = container_of(default_objects)["env"]
    (identity,) = [item for item in env if item["name"] == settings.KOPF_IDENTITY_ENV]
    serving = settings.ServingSettings.from_environ(env_of(default_objects))

    assert "--standalone" not in command
    assert f"--peering={peering['metadata']['name']}" in command
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert serving.peering_lifetime_seconds == 20
    crds = {crd["metadata"]["name"] for crd in objects_of_kind(default_objects,
                                                               "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= crds


def test_watched_namespaces_get_a_peering_object_and_its_rights_each() -> None:
    objects = render_chart({"operator": {"watchNamespaces": ["team-a", "team-b"]}})
    peerings = objects_of_kind(objects, "KopfPeering")
    roles = objects_of_kind(objects, "Role")
    (entry,) = api_access.NAMESPACED_PEERING_API_ACCESS

    assert not objects_of_kind(objects, "ClusterKopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in peerings} == {"dp-durable-producer"}
    for role in roles:
        assert {"apiGroups": [entry[0]], "resources": [entry[1]], "verbs": list(entry[2])} in (
            role["rules"])


def test_the_webhook_waits_ten_seconds_and_the_operator_stops_its_calls_before(
    default_objects: list[dict[str, Any]],
) -> None:
    (webhook,) = single_object(default_objects, "MutatingWebhookConfiguration")["webhooks"]
    config = settings.OperatorConfig.from_environ(env_of(default_objects))

    assert webhook["timeoutSeconds"] == 10
    assert config.webhook.timeout_seconds == 10
    assert config.webhook.api_budget_seconds == 8


def test_the_pod_monitor_is_optional_and_scrapes_the_metrics_port(
    default_objects: list[dict[str, Any]],
) -> None:
    objects = render_chart({"metrics": {"podMonitor": {
        "enabled": True, "interval": "15s", "labels": {"release": "prometheus"}}}})
    monitor = single_object(objects, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]

    assert not objects_of_kind(default_objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    assert {"targetLabel": "job", "replacement": "durable-operator"} in endpoint["relabelings"]
