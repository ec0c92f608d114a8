"""Per-pod agent settings and the opt-out, through the real webhook called by the real API
server for real pod creates; counted in /metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable_producer import contract
from durable_producer.operator.decide import agent_versions, reconcile
from durable_producer.operator.model.installation import AgentImage
from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import AGENT_IMAGE, durable_producer, opted_in_pod

pytestmark = pytest.mark.integration


def admissions(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "durable_operator_admission_requests_total"
    }


@pytest.fixture()
def webhook_with_metrics(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> tuple[KubeApi, str]:
    """The API server (which calls the operator's webhook) and the operator's /metrics."""
    kube_api.create(durable_producer())
    operator = start_chart_operator()
    return kube_api, operator.metrics_url


def annotated(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    pod = opted_in_pod(name)
    pod["metadata"]["annotations"] = annotations
    return pod


def test_a_pods_annotations_set_its_agents_resources_fsync_and_log_level(
    webhook_with_metrics: tuple[KubeApi, str]
) -> None:
    kube_api, metrics_url = webhook_with_metrics
    pod = annotated("tuned", {
        contract.CPU_REQUEST_ANNOTATION: "250m",
        contract.MEMORY_LIMIT_ANNOTATION: "1Gi",
        contract.FSYNC_POLICY_ANNOTATION: "always",
        contract.LOG_LEVEL_ANNOTATION: "debug",
    })

    result = kube_api.run_pod(pod)
    agent = result["spec"]["initContainers"][0]

    assert agent["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"},
                                  "limits": {"cpu": "1", "memory": "1Gi"}}
    assert "--fsync=always" in agent["args"]
    assert "--log-level=DEBUG" in agent["args"]
    spec = reconcile.parse_spec(durable_producer()["spec"])
    assert not isinstance(spec, str)
    assert result["metadata"]["annotations"][contract.AGENT_HASH_ANNOTATION] == (
        agent_versions.expected_hash(result, spec, AgentImage(image=AGENT_IMAGE)))
    wait_for(lambda: ((kube_api.get("orders") or {}).get("status") or {}).get(
        "outdatedAgents") == 0, timeout=60, what="the tuned pod not counted as outdated")
    # The API server reinvokes the webhook once after its own plugins ran again; that second
    # pass mutates again (D6, test_webhook_on_api_server.py): one pod, one or two "mutated".
    assert admissions(metrics_url)["mutated"] >= 1


def test_bad_annotations_refuse_the_pod_naming_each_problem(
    webhook_with_metrics: tuple[KubeApi, str]
) -> None:
    kube_api, metrics_url = webhook_with_metrics
    pod = annotated("typo", {
        contract.CPU_REQUEST_ANNOTATION: "a lot",
        contract.FSYNC_POLICY_ANNOTATION: "sometimes",
        f"{contract.POD_OVERRIDE_PREFIX}memory-requests": "1Gi",
    })

    status, answer = kube_api.create_pod(pod)
    message = answer["message"]

    assert status == 400, answer
    assert f"{contract.CPU_REQUEST_ANNOTATION}: 'a lot' is not a Kubernetes quantity" in message
    assert f"{contract.FSYNC_POLICY_ANNOTATION}: 'sometimes' is not one of" in message
    assert f"{contract.POD_OVERRIDE_PREFIX}memory-requests is not known" in message
    assert kube_api.items(kube_api.pvcs_path) == {}  # refused before any volume was claimed
    assert admissions(metrics_url)["refused"] == 1


def test_a_limit_below_the_request_is_refused(
    webhook_with_metrics: tuple[KubeApi, str],
) -> None:
    kube_api, _ = webhook_with_metrics
    pod = annotated("squeezed", {contract.MEMORY_LIMIT_ANNOTATION: "64Mi"})  # request 128Mi

    status, answer = kube_api.create_pod(pod)

    assert status == 400, answer
    assert "memory limit 64Mi is below its request 128Mi" in answer["message"]


def test_an_opted_out_pod_is_admitted_as_it_is_and_not_reported(
    webhook_with_metrics: tuple[KubeApi, str]
) -> None:
    kube_api, metrics_url = webhook_with_metrics
    pod = annotated("debug-shell", {contract.INJECT_ANNOTATION: "false"})

    status, created, warnings = kube_api.create_pod_warned(pod)

    assert status == 201, created
    assert "initContainers" not in created["spec"]
    assert any("no buffer agent" in warning for warning in warnings), warnings
    assert kube_api.items(kube_api.pvcs_path) == {}
    # The control: a labelled pod that got past the webhook without an agent is reported
    # (created while the webhook configuration did not select it, as with failurePolicy Ignore
    # during an outage).
    configurations = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    (configuration,) = [c for c in kube_api.items(configurations).values()
                        if kube_api.namespace in c["metadata"]["name"]]
    path = f"{configurations}/{configuration['metadata']['name']}"
    assert kube_api.call("DELETE", path)[0] == 200
    kube_api.run_pod(opted_in_pod("sneaked-in"))

    degraded = wait_for(lambda: next(
        (c for c in ((kube_api.get("orders") or {}).get("status") or {}).get(
            "conditions") or [] if c["type"] == "Degraded" and c["status"] == "True"), None),
        timeout=60, what="the audit reporting the pod without an agent")

    assert "sneaked-in" in degraded["message"]
    assert "debug-shell" not in degraded["message"]
    assert admissions(metrics_url)["admitted"] == 1


def test_a_host_network_pod_gets_its_agent_and_a_warning_about_the_nodes_ports(
    webhook_with_metrics: tuple[KubeApi, str]
) -> None:
    """Its agent listens on the node's ports; a second such pod on the node cannot start its
    agent. Admitted (one a node works), but the user who applies it reads why."""
    kube_api, _ = webhook_with_metrics
    pod = opted_in_pod("on-the-node")
    pod["spec"]["hostNetwork"] = True

    status, created, warnings = kube_api.create_pod_warned(pod)

    assert status == 201, created
    assert any(c["name"] == contract.AGENT_CONTAINER_NAME
               for c in created["spec"]["initContainers"]), created["spec"]
    assert any("node's ports 9092 and 9644" in warning for warning in warnings), warnings
