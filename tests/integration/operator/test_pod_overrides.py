"""Per-pod agent settings and the opt-out, through the real webhook; counted in /metrics."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable_producer import contract
from durable_producer.operator import agent_versions, reconcile
from durable_producer.operator.settings import AgentImage
from integration.operator.operator_harness import KubernetesApi
from integration.operator.test_webhook_harness import (
    AGENT_IMAGE,
    PODS_PATH,
    PVCS_PATH,
    WebhookOperator,
    api_call,
    durable_producer,
    items,
    opted_in_pod,
    patched,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> tuple[WebhookOperator, str]:
    kubernetes_api.create(durable_producer())
    port = _free_port()
    webhook = start_webhook_operator(DURABLE_PRODUCER_METRICS_ADDR="127.0.0.1",
                                     DURABLE_PRODUCER_METRICS_PORT=str(port))
    return webhook, f"http://127.0.0.1:{port}/metrics"


def annotated(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    pod = opted_in_pod(name)
    pod["metadata"]["annotations"] = annotations
    return pod


def test_a_pods_annotations_set_its_agents_resources_fsync_and_log_level(
    kubernetes_api: KubernetesApi, webhook_with_metrics: tuple[WebhookOperator, str]
) -> None:
    webhook, metrics_url = webhook_with_metrics
    pod = annotated("tuned", {
        contract.CPU_REQUEST_ANNOTATION: "250m",
        contract.MEMORY_LIMIT_ANNOTATION: "1Gi",
        contract.FSYNC_POLICY_ANNOTATION: "always",
        contract.LOG_LEVEL_ANNOTATION: "debug",
    })

    response = webhook.review(pod)
    result = patched(pod, response)
    agent = result["spec"]["initContainers"][0]

    assert response["allowed"] is True
    assert agent["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"},
                                  "limits": {"memory": "1Gi"}}
    assert "--fsync=always" in agent["args"]
    assert "--log-level=DEBUG" in agent["args"]
    spec = reconcile.parse_spec(durable_producer()["spec"])
    assert not isinstance(spec, str)
    assert result["metadata"]["annotations"][contract.AGENT_HASH_ANNOTATION] == (
        agent_versions.expected_hash(result, spec, AgentImage(image=AGENT_IMAGE)))
    result["status"] = {"phase": "Running"}
    assert api_call(kubernetes_api, "POST", PODS_PATH, result)[0] in (200, 201)
    wait_for(lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
        "outdatedAgents") == 0, timeout=60, what="the tuned pod not counted as outdated")
    assert admissions(metrics_url)["mutated"] == 1


def test_bad_annotations_refuse_the_pod_naming_each_problem(
    kubernetes_api: KubernetesApi, webhook_with_metrics: tuple[WebhookOperator, str]
) -> None:
    webhook, metrics_url = webhook_with_metrics
    pod = annotated("typo", {
        contract.CPU_REQUEST_ANNOTATION: "a lot",
        contract.FSYNC_POLICY_ANNOTATION: "sometimes",
        f"{contract.POD_OVERRIDE_PREFIX}memory-requests": "1Gi",
    })

    response = webhook.review(pod)
    message = response["status"]["message"]

    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert f"{contract.CPU_REQUEST_ANNOTATION}: 'a lot' is not a Kubernetes quantity" in message
    assert f"{contract.FSYNC_POLICY_ANNOTATION}: 'sometimes' is not one of" in message
    assert f"{contract.POD_OVERRIDE_PREFIX}memory-requests is not known" in message
    assert items(kubernetes_api, PVCS_PATH) == {}  # refused before any volume was claimed
    assert admissions(metrics_url)["refused"] == 1


def test_a_limit_below_the_request_is_refused(
    webhook_with_metrics: tuple[WebhookOperator, str],
) -> None:
    webhook, _ = webhook_with_metrics
    pod = annotated("squeezed", {contract.MEMORY_LIMIT_ANNOTATION: "64Mi"})  # request 128Mi

    response = webhook.review(pod)

    assert response["allowed"] is False
    assert "memory limit 64Mi is below its request 128Mi" in response["status"]["message"]


def test_an_opted_out_pod_is_admitted_as_it_is_and_not_reported(
    kubernetes_api: KubernetesApi, webhook_with_metrics: tuple[WebhookOperator, str]
) -> None:
    webhook, metrics_url = webhook_with_metrics
    pod = annotated("debug-shell", {contract.INJECT_ANNOTATION: "false"})

    response = webhook.review(pod)

    assert response["allowed"] is True
    assert "patch" not in response
    assert any("no buffer agent" in warning for warning in response.get("warnings", []))
    assert items(kubernetes_api, PVCS_PATH) == {}
    running = {**pod, "status": {"phase": "Running"}}
    assert api_call(kubernetes_api, "POST", PODS_PATH, running)[0] in (200, 201)
    # The control: a labelled pod that got past the webhook without an agent is reported.
    sneaked = {**opted_in_pod("sneaked-in"), "status": {"phase": "Running"}}
    assert api_call(kubernetes_api, "POST", PODS_PATH, sneaked)[0] in (200, 201)

    degraded = wait_for(lambda: next(
        (c for c in ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
            "conditions") or [] if c["type"] == "Degraded" and c["status"] == "True"), None),
        timeout=60, what="the audit reporting the pod without an agent")

    assert "sneaked-in" in degraded["message"]
    assert "debug-shell" not in degraded["message"]
    assert admissions(metrics_url)["admitted"] == 1
