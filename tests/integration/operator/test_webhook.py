"""Real HTTPS AdmissionReviews sent straight to the chart's operator (kopf run) on the real API
server: the exact patch it answers, and reviews an API server would never send. The API
server calling the webhook itself: test_webhook_on_api_server.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer import contract
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec
from support.kube_harness import ChartOperator, KubeApi
from support.webhook_harness import (
    AGENT_IMAGE,
    durable_producer,
    opted_in_pod,
    patched,
)

pytestmark = pytest.mark.integration

INSTALLED_AGENT_IMAGE = AgentImage(image=AGENT_IMAGE)
SPEC = DurableProducerSpec.model_validate(durable_producer()["spec"])


@pytest.fixture()
def webhook(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> ChartOperator:
    kube_api.create(durable_producer("orders"))
    return start_chart_operator()


def deployment_pod() -> dict[str, Any]:
    """A pod as a ReplicaSet submits it: generateName only, owned by the ReplicaSet."""
    pod = opted_in_pod("unused", terminationGracePeriodSeconds=30, restartPolicy="Always")
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "orders-5c7d-"
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                           "name": "orders-5c7d", "uid": "rs-1",
                                           "controller": True}]
    return pod


def placed(webhook: ChartOperator, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod in the test's namespace, as ``review`` sends it: the webhook records the pod's
    namespace in its annotation."""
    pod["metadata"]["namespace"] = webhook.namespace
    return pod


def expected(pod: dict[str, Any], claim: str, token: str | None) -> dict[str, Any]:
    return pod_mutation.mutated_pod(pod, "orders", SPEC, claim, INSTALLED_AGENT_IMAGE,
                                    claim_token=token)


def token_of(result: dict[str, Any]) -> str | None:
    """The claim token the webhook put on the pod (the same as on its volume)."""
    return (result["metadata"].get("annotations") or {}).get(contract.CLAIM_TOKEN_ANNOTATION)


def test_plain_deployment_pod_is_mutated_exactly_and_gets_its_own_volume(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    pod = placed(webhook, deployment_pod())

    response = webhook.review(pod)
    result = patched(pod, response)

    assert response["allowed"] is True
    claim = result["metadata"]["annotations"][contract.BUFFER_VOLUME_ANNOTATION]
    assert result == expected(pod, claim, token_of(result))
    assert result["spec"]["initContainers"][0]["image"] == AGENT_IMAGE
    volumes = kube_api.items(kube_api.pvcs_path)
    assert list(volumes) == [claim]
    annotations = volumes[claim]["metadata"]["annotations"]
    assert annotations[vp.CLAIM_TOKEN_ANNOTATION] == token_of(result)
    assert annotations[vp.BACKLOG_ANNOTATION] == vp.BACKLOG_UNKNOWN
    assert "ownerReferences" not in volumes[claim]["metadata"]  # the finalizer owns it (D2)
    assert volumes[claim]["spec"]["accessModes"] == ["ReadWriteOnce"]

    again = webhook.review(result)

    assert again["allowed"] is True
    assert patched(result, again) == result  # applying the webhook twice equals once
    assert list(kube_api.items(kube_api.pvcs_path)) == [claim]


def test_pod_with_an_init_container_keeps_it_after_the_agent(webhook: ChartOperator) -> None:
    migrate = {"name": "migrate", "image": "shop/migrate:1", "command": ["migrate"]}
    pod = placed(webhook, opted_in_pod("with-init", initContainers=[copy.deepcopy(migrate)]))

    result = patched(pod, webhook.review(pod))

    claim = pod_mutation.claimed_volume(result)
    assert claim is not None
    assert result == expected(pod, claim, token_of(result))
    assert [c["name"] for c in result["spec"]["initContainers"]] == ["durable-agent", "migrate"]
    assert result["spec"]["initContainers"][1] == migrate


def test_pod_with_a_native_sidecar_gets_the_agent_after_it(webhook: ChartOperator) -> None:
    """D4 (b): a native sidecar (a mesh proxy) stops after the agent, which needs it for its
    final drain: the agent goes after it, before the ordinary init containers after it."""
    proxy = {"name": "mesh-proxy", "image": "mesh/proxy:1", "restartPolicy": "Always"}
    migrate = {"name": "migrate", "image": "shop/migrate:1", "command": ["migrate"]}
    pod = placed(webhook, opted_in_pod("with-proxy", initContainers=[
        copy.deepcopy(proxy), copy.deepcopy(migrate)]))

    result = patched(pod, webhook.review(pod))

    claim = pod_mutation.claimed_volume(result)
    assert claim is not None
    assert result == expected(pod, claim, token_of(result))
    assert [c["name"] for c in result["spec"]["initContainers"]] == [
        "mesh-proxy", "durable-agent", "migrate"]
    assert result["spec"]["initContainers"][0] == proxy


def test_a_pod_gets_the_agents_metrics_port_excluded_from_mesh_interception(
    webhook: ChartOperator,
) -> None:
    """D4 (c): merged into the pod's own exclusions, once (a second review changes nothing)."""
    pod = placed(webhook, opted_in_pod("excluded"))
    pod["metadata"]["annotations"] = {"traffic.sidecar.istio.io/excludeInboundPorts": "8080"}

    result = patched(pod, webhook.review(pod))

    annotations = result["metadata"]["annotations"]
    assert annotations["traffic.sidecar.istio.io/excludeInboundPorts"] == "8080,9644"
    assert annotations["config.linkerd.io/skip-inbound-ports"] == "9644"
    assert patched(result, webhook.review(result)) == result


def test_reinvocation_after_another_webhook_changed_the_pod(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    pod = placed(webhook, opted_in_pod("reinvoked"))
    first = patched(pod, webhook.review(pod))
    # Another mutating webhook runs after ours and adds a proxy; IfNeeded re-invokes ours.
    changed = copy.deepcopy(first)
    changed["spec"]["containers"].append({"name": "mesh-proxy", "image": "mesh/proxy:1"})
    changed["metadata"]["annotations"]["mesh/injected"] = "true"

    result = patched(changed, webhook.review(changed))

    claim = pod_mutation.claimed_volume(first)
    assert claim is not None and pod_mutation.claimed_volume(result) == claim
    assert result == expected(changed, claim, token_of(first))
    proxy_env = {e["name"]: e["value"] for e in result["spec"]["containers"][1]["env"]}
    assert proxy_env["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert [c["name"] for c in result["spec"]["initContainers"]] == ["durable-agent"]
    assert result["metadata"]["annotations"]["mesh/injected"] == "true"
    assert list(kube_api.items(kube_api.pvcs_path)) == [claim]  # no second volume claimed


def test_dry_run_mutates_but_claims_and_creates_nothing(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    pod = placed(webhook, opted_in_pod("dry"))

    response = webhook.review(pod, dry_run=True)
    result = patched(pod, response)

    assert response["allowed"] is True
    assert any("dry run" in warning for warning in response.get("warnings", []))
    claim = pod_mutation.claimed_volume(result)
    assert claim == vp.volume_name("orders", "dry-run")
    assert result == expected(pod, claim, token_of(result))
    assert kube_api.items(kube_api.pvcs_path) == {}


def test_pod_naming_a_missing_producer_is_rejected_with_the_reason(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    pod = opted_in_pod("lost", producer="ghost")

    response = webhook.review(pod)

    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert f"no DurableProducer {kube_api.namespace}/ghost exists" in response["status"]["message"]
    assert "patch" not in response
    assert kube_api.items(kube_api.pvcs_path) == {}


def test_pod_without_the_label_passes_untouched(webhook: ChartOperator) -> None:
    pod = opted_in_pod("plain")
    del pod["metadata"]["labels"]["durable.dev/producer"]

    response = webhook.review(pod)

    assert response["allowed"] is True
    assert "patch" not in response


@pytest.mark.parametrize("payload", [
    b"{not json",
    json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "1", "resource": {"group": "", "version": "v1",
                                                     "resource": "pods"},
                            "operation": "CREATE"}}).encode(),
    json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "1", "userInfo": {}, "object": {},
                            "resource": {"group": "", "version": "v1",
                                         "resource": "widgets"}}}).encode(),
], ids=["not-json", "no-object-or-user", "unknown-resource"])
def test_malformed_reviews_are_refused_and_the_server_keeps_serving(
    webhook: ChartOperator, payload: bytes
) -> None:
    status, answer = webhook.post(payload)

    assert status in (400, 404), answer
    assert webhook.review(opted_in_pod("after-garbage"))["allowed"] is True
